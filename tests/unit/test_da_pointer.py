from __future__ import annotations

import hashlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from verinfer.da_client.errors import MalformedPointerError
from verinfer.da_client.pointer import Pointer


@given(st.binary(min_size=32, max_size=32), st.sampled_from(["local", "redis"]))
def test_sha_backends_round_trip(commitment: bytes, backend: str) -> None:
    p = Pointer(backend, commitment)
    text = str(p)
    assert text == f"da://{backend}/0x{commitment.hex()}"
    assert Pointer.parse(text) == p
    assert p.blob_sha256 == commitment


@given(st.binary(min_size=33, max_size=300))
def test_eigenda_round_trip_carries_sha256_and_certificate(commitment: bytes) -> None:
    p = Pointer.parse(f"da://eigenda/0x{commitment.hex()}")
    assert p.blob_sha256 == commitment[:32]
    assert p.certificate == commitment[32:]
    assert str(p) == f"da://eigenda/0x{commitment.hex()}"


def test_for_blob_is_sha256() -> None:
    assert Pointer.for_blob("local", b"abc").commitment == hashlib.sha256(b"abc").digest()
    with pytest.raises(MalformedPointerError):
        Pointer.for_blob("eigenda", b"abc")


H = "ab" * 32


@pytest.mark.parametrize("text", [
    "",
    f"da:/local/0x{H}",
    f"http://local/0x{H}",
    f"da://s3/0x{H}",                 # unknown backend
    f"da://LOCAL/0x{H}",
    f"da://local/{H}",                # no 0x
    f"da://local/0x{H.upper()}",      # one spelling only
    f"da://local/0x{H}0",             # odd digit count
    f"da://local/0x{H[:-2]}",         # 31 bytes
    f"da://local/0x{H}00",            # 33 bytes
    f"da://eigenda/0x{H}",            # sha256 but no certificate
    f"da://local/0x{H} ",
    f"da://local/0x{H}\n",
    "da://local/0xzz" + H[4:],
])
def test_malformed_pointers_are_typed_errors(text: str) -> None:
    with pytest.raises(MalformedPointerError) as ei:
        Pointer.parse(text)
    assert ei.value.caller_fault  # the caller handed in a bad pointer


def test_non_string_and_bad_fields() -> None:
    with pytest.raises(MalformedPointerError):
        Pointer.parse(b"da://local/0x00")  # type: ignore[arg-type]
    with pytest.raises(MalformedPointerError):
        Pointer("local", "00" * 32)  # type: ignore[arg-type]
    with pytest.raises(MalformedPointerError, match="at most"):
        Pointer("eigenda", bytes(32 + 70_000))
