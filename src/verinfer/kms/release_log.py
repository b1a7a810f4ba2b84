"""Append-only release log: JSON Lines with a hash chain.

Each line is an RFC 8785 JSON object with ``seq`` (from 0), ``prev`` (hash of the previous
line's entry, 64 zero hex digits for the first) and ``hash`` = sha256 of the canonical entry
without ``hash``. Editing, dropping or reordering a line breaks the chain
(``verify_release_log``). Entries describe decisions only — never share material, keys or
plaintext.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import rfc8785

from verinfer.errors import ServerError

GENESIS = "0" * 64
FORBIDDEN_FIELDS = frozenset({"share", "encrypted_share", "secret", "seed", "plaintext"})


class ReleaseLogError(ServerError):
    code = "release_log_corrupt"


def _entry_hash(entry: Mapping[str, Any]) -> str:
    body = {k: v for k, v in entry.items() if k != "hash"}
    return hashlib.sha256(rfc8785.dumps(body)).hexdigest()


def verify_release_log(path: Path) -> tuple[int, str]:
    """Check the whole chain; returns (entry count, last hash)."""
    prev, seq = GENESIS, 0
    if not path.exists():
        return 0, prev
    with path.open("rb") as f:
        for lineno, line in enumerate(f, 1):
            try:
                entry = json.loads(line)
            except ValueError as e:
                raise ReleaseLogError(f"{path}:{lineno}: not JSON") from e
            if entry.get("seq") != seq or entry.get("prev") != prev:
                raise ReleaseLogError(f"{path}:{lineno}: chain broken (seq/prev mismatch)")
            if entry.get("hash") != _entry_hash(entry):
                raise ReleaseLogError(f"{path}:{lineno}: entry hash mismatch")
            prev, seq = entry["hash"], seq + 1
    return seq, prev


class ReleaseLog:
    """Verifies the existing chain on open, then appends with fsync."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._seq, self._prev = verify_release_log(self.path)
        self._lock = threading.Lock()

    def append(self, fields: Mapping[str, Any]) -> dict[str, Any]:
        bad = FORBIDDEN_FIELDS & set(fields)
        if bad:
            raise ReleaseLogError(f"refusing to log secret-bearing fields {sorted(bad)}")
        with self._lock:
            entry: dict[str, Any] = {**fields, "seq": self._seq, "prev": self._prev}
            entry["hash"] = _entry_hash(entry)
            line = rfc8785.dumps(entry) + b"\n"
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            try:
                os.write(fd, line)
                os.fsync(fd)
            finally:
                os.close(fd)
            self._seq, self._prev = self._seq + 1, entry["hash"]
            return entry
