"""Where the shards are and who they are: ``shards.json``.

{"version": 1, "shards": [{"index": 1, "url": "http://127.0.0.1:8101", "address": "0x…"}]}
The enclave trusts a release only if it is signed by the address listed for that index.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from verinfer.kms.errors import RegistryError


@dataclass(frozen=True)
class ShardInfo:
    index: int
    url: str
    address: str  # lower-case 0x-hex


def load_directory(path: Path) -> list[ShardInfo]:
    try:
        raw = json.loads(path.read_text())
        out = [ShardInfo(int(s["index"]), str(s["url"]).rstrip("/"), str(s["address"]).lower())
               for s in raw["shards"]]
    except FileNotFoundError:
        return []
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise RegistryError(f"cannot read shard directory {path}: {e}") from e
    if len({s.index for s in out}) != len(out):
        raise RegistryError(f"{path}: duplicate shard indices")
    return sorted(out, key=lambda s: s.index)


def upsert_shard(path: Path, info: ShardInfo) -> None:
    shards = {s.index: s for s in load_directory(path)}
    shards[info.index] = info
    body = {"version": 1, "shards": [{"index": s.index, "url": s.url, "address": s.address}
                                     for s in sorted(shards.values(), key=lambda s: s.index)]}
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(body, indent=2) + "\n")
    tmp.replace(path)
