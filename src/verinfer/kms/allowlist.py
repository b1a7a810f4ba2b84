"""Enclave measurements a shard accepts. The on-chain list (ProtocolConfig) plugs in behind
``MeasurementAllowlist`` later; ``FileMeasurementAllowlist`` re-reads
{"measurements": ["0x…32 bytes"]} on every call so an edit takes effect at once."""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Protocol

from verinfer.kms.errors import RegistryError
from verinfer.protocol.hexutil import parse_hex, to_hex


class MeasurementAllowlist(Protocol):
    def allowed(self) -> frozenset[bytes]: ...


class StaticMeasurementAllowlist:
    def __init__(self, measurements: Iterable[bytes]) -> None:
        self._m = frozenset(measurements)

    def allowed(self) -> frozenset[bytes]:
        return self._m


class FileMeasurementAllowlist:
    def __init__(self, path: Path) -> None:
        self.path = Path(path)

    def allowed(self) -> frozenset[bytes]:
        try:
            raw = json.loads(self.path.read_text())
            items = raw["measurements"]
            out = frozenset(parse_hex(m, None, "measurement") for m in items)
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise RegistryError(f"cannot read measurement allowlist {self.path}: {e}") from e
        bad = [m.hex() for m in out if len(m) != 32]
        if bad:
            raise RegistryError(f"{self.path}: measurements must be 32 bytes: {bad}")
        return out


def write_allowlist(path: Path, measurements: Iterable[bytes]) -> None:
    path.write_text(json.dumps({"measurements": sorted(to_hex(m) for m in measurements)},
                               indent=2) + "\n")
