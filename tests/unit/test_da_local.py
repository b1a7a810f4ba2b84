from __future__ import annotations

import os
import sqlite3
from pathlib import Path

import pytest

from verinfer.da_client.errors import (
    BackendMismatchError,
    BlobNotFoundError,
    BlobTooLargeError,
    CommitmentMismatchError,
)
from verinfer.da_client.local import LocalDAClient
from verinfer.da_client.pointer import Pointer


@pytest.fixture
def store(tmp_path: Path) -> LocalDAClient:
    return LocalDAClient(tmp_path / "da")


@pytest.mark.parametrize("size", [0, 1, 4096, 256 * 1024])
def test_round_trip(store: LocalDAClient, size: int) -> None:
    blob = os.urandom(size)
    p = store.put(blob)
    assert p == Pointer.for_blob("local", blob)
    assert store.exists(p)
    assert store.get(p) == blob
    assert store.put(blob) == p  # idempotent


def test_put_many_is_one_transaction(store: LocalDAClient) -> None:
    blobs = [os.urandom(100) for _ in range(50)]
    pointers = store.put_many([*blobs, blobs[0]])
    assert pointers[-1] == pointers[0]
    assert [store.get(p) for p in pointers[:-1]] == blobs
    with pytest.raises(BlobTooLargeError):
        store.put_many([b"fits", bytes(store.max_blob_bytes + 1)])
    assert not store.exists(Pointer.for_blob("local", b"fits"))  # checked before writing


def _overwrite(store: LocalDAClient, p: Pointer, data: bytes) -> None:
    with sqlite3.connect(store.path) as db:
        db.execute("UPDATE blobs SET data = ? WHERE commitment = ?", (data, p.commitment))


def test_corrupted_file_is_rejected(store: LocalDAClient) -> None:
    p = store.put(b"evidence" * 100)
    data = bytearray(store.get(p))
    data[7] ^= 0x01
    _overwrite(store, p, bytes(data))
    with pytest.raises(CommitmentMismatchError, match="expected sha256"):
        store.get(p)
    _overwrite(store, p, b"evidence" * 99)  # truncated
    with pytest.raises(CommitmentMismatchError):
        store.get(p)
    assert store.put(b"evidence" * 100) == p  # re-publishing repairs the stored copy
    assert store.get(p) == b"evidence" * 100


def test_missing_blob(store: LocalDAClient) -> None:
    p = Pointer.for_blob("local", b"never stored")
    assert not store.exists(p)
    with pytest.raises(BlobNotFoundError) as ei:
        store.get(p)
    assert ei.value.caller_fault and ei.value.code == "da_blob_not_found"


def test_oversized_blob(tmp_path: Path) -> None:
    small = LocalDAClient(tmp_path, max_blob_bytes=1024)
    small.put(bytes(1024))
    with pytest.raises(BlobTooLargeError, match="1025 bytes exceeds the local limit of 1024"):
        small.put(bytes(1025))
    assert not small.exists(Pointer.for_blob("local", bytes(1025)))


def test_pointer_of_other_backend(store: LocalDAClient) -> None:
    with pytest.raises(BackendMismatchError):
        store.get(Pointer.for_blob("redis", b"x"))


def test_survives_reopen(tmp_path: Path) -> None:
    p = LocalDAClient(tmp_path).put(b"durable")
    assert LocalDAClient(tmp_path).get(p) == b"durable"
