"""Local content-addressed store: one file per blob, named by its sha256.

Durability: the blob is written to a temporary file in the target directory, fsynced, renamed
into place atomically, and the directory is fsynced, so after ``put`` returns the blob survives
a crash or power loss, and a reader never sees a half-written blob under its final name.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from verinfer.da_client.base import DEFAULT_MAX_BLOB_BYTES, DAClient
from verinfer.da_client.errors import BlobNotFoundError
from verinfer.da_client.pointer import Pointer


class LocalDAClient(DAClient):
    backend = "local"

    def __init__(self, root: str | os.PathLike[str], *,
                 max_blob_bytes: int = DEFAULT_MAX_BLOB_BYTES) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.max_blob_bytes = max_blob_bytes

    def path_for(self, pointer: Pointer) -> Path:
        h = pointer.commitment.hex()
        return self.root / h[:2] / h  # 256-way fan-out keeps directories small

    def _put(self, blob: bytes, digest: bytes) -> Pointer:
        pointer = Pointer("local", digest)
        path = self.path_for(pointer)
        if path.exists():  # content-addressed: same name, same bytes (get re-verifies)
            return pointer
        if not path.parent.is_dir():
            path.parent.mkdir(exist_ok=True)
            _fsync_dir(self.root)  # the new fan-out directory's entry must survive too
        fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=path.parent)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(blob)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        _fsync_dir(path.parent)
        return pointer

    def _get(self, pointer: Pointer) -> bytes:
        try:
            return self.path_for(pointer).read_bytes()
        except FileNotFoundError:
            raise BlobNotFoundError(f"no blob {pointer} in local store {self.root}",
                                    param="pointer") from None

    def _exists(self, pointer: Pointer) -> bool:
        return self.path_for(pointer).is_file()


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
