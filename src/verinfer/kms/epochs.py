"""Key epochs and where they are registered.

An epoch record is public: threshold, share count, HPKE suite, the app public key derived from
the epoch secret, and the Feldman commitments. ``EpochRegistry`` is the interface every shard
and enclave reads; ``FileEpochRegistry`` is the JSON-file implementation (``epochs.json``). The
on-chain implementation (ProtocolConfig) plugs in behind the same interface later.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from collections.abc import Iterator
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Literal, Protocol

from verinfer.kms.errors import (
    EpochError,
    EpochExistsError,
    EpochRetiredError,
    RegistryError,
)
from verinfer.protocol.hexutil import parse_hex

EpochStatus = Literal["live", "retired"]
REGISTRY_VERSION = 1


@dataclass(frozen=True)
class EpochRecord:
    epoch: int
    threshold: int
    shares: int
    suite: str
    public_key: str  # 0x-hex, the HPKE app public key of this epoch
    commitments: tuple[str, ...]  # 0x-hex compressed secp256k1 points C_0..C_{t-1}
    status: EpochStatus
    created_at: int
    retired_at: int | None = None

    @property
    def commitment_bytes(self) -> list[bytes]:
        return [parse_hex(c, None, f"epoch {self.epoch} commitment") for c in self.commitments]

    @property
    def public_key_bytes(self) -> bytes:
        return parse_hex(self.public_key, None, f"epoch {self.epoch} public_key")

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["commitments"] = list(self.commitments)
        return d

    @classmethod
    def from_json(cls, d: Any) -> EpochRecord:
        try:
            rec = cls(epoch=int(d["epoch"]), threshold=int(d["threshold"]),
                      shares=int(d["shares"]), suite=str(d["suite"]),
                      public_key=str(d["public_key"]),
                      commitments=tuple(str(c) for c in d["commitments"]),
                      status=d["status"], created_at=int(d["created_at"]),
                      retired_at=None if d.get("retired_at") is None else int(d["retired_at"]))
        except (KeyError, TypeError, ValueError) as e:
            raise RegistryError(f"malformed epoch record: {d!r}") from e
        if rec.status not in ("live", "retired"):
            raise RegistryError(f"epoch {rec.epoch}: unknown status {rec.status!r}")
        if len(rec.commitments) != rec.threshold:
            raise RegistryError(f"epoch {rec.epoch}: {len(rec.commitments)} commitments for "
                                f"threshold {rec.threshold}")
        return rec


class EpochRegistry(Protocol):
    def get(self, epoch: int) -> EpochRecord:
        """The record, or EpochError if unknown."""
        ...

    def register(self, record: EpochRecord) -> None: ...

    def retire(self, epoch: int, now: int) -> EpochRecord: ...

    def all(self) -> list[EpochRecord]: ...


def require_live(registry: EpochRegistry, epoch: int) -> EpochRecord:
    rec = registry.get(epoch)
    if rec.status != "live":
        raise EpochRetiredError(f"epoch {epoch} is retired (since {rec.retired_at})")
    return rec


class FileEpochRegistry:
    """``epochs.json``; re-read on every lookup so that a retirement reaches running shards
    without a restart. Writers take an flock and replace the file atomically."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)

    def _load(self) -> dict[int, EpochRecord]:
        try:
            raw = json.loads(self.path.read_text())
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as e:
            raise RegistryError(f"cannot read epoch registry {self.path}: {e}") from e
        if not isinstance(raw, dict) or raw.get("version") != REGISTRY_VERSION:
            raise RegistryError(f"{self.path}: expected version {REGISTRY_VERSION}")
        recs = [EpochRecord.from_json(d) for d in raw.get("epochs", [])]
        return {r.epoch: r for r in recs}

    def _store(self, recs: dict[int, EpochRecord]) -> None:
        body = {"version": REGISTRY_VERSION,
                "epochs": [recs[k].to_json() for k in sorted(recs)]}
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text(json.dumps(body, indent=2) + "\n")
        os.replace(tmp, self.path)

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path.with_name(self.path.name + ".lock"), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def get(self, epoch: int) -> EpochRecord:
        rec = self._load().get(epoch)
        if rec is None:
            raise EpochError(f"epoch {epoch} is not registered in {self.path}")
        return rec

    def all(self) -> list[EpochRecord]:
        recs = self._load()
        return [recs[k] for k in sorted(recs)]

    def register(self, record: EpochRecord) -> None:
        with self._locked():
            recs = self._load()
            if record.epoch in recs:
                raise EpochExistsError(f"epoch {record.epoch} already registered")
            recs[record.epoch] = record
            self._store(recs)

    def retire(self, epoch: int, now: int) -> EpochRecord:
        with self._locked():
            recs = self._load()
            if epoch not in recs:
                raise EpochError(f"epoch {epoch} is not registered in {self.path}")
            rec = recs[epoch]
            if rec.status == "retired":
                return rec
            recs[epoch] = replace(rec, status="retired", retired_at=now)
            self._store(recs)
            return recs[epoch]
