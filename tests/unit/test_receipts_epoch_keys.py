"""Epoch key derivation: deterministic, suite-separated, and serializable both ways."""

from __future__ import annotations

import hashlib
import hmac

import pytest
from cryptography.hazmat.primitives.asymmetric import mlkem, x25519

from verinfer.protocol.errors import ReceiptFormatError
from verinfer.receipts.epoch_keys import (
    EnvelopeSuite,
    derive_epoch_keypair,
    load_public_key,
    public_key_bytes,
)

SEED = bytes(range(32))


@pytest.mark.parametrize("suite", list(EnvelopeSuite))
def test_derivation_is_deterministic_and_round_trips(suite: EnvelopeSuite) -> None:
    sk, pk = derive_epoch_keypair(SEED, suite)
    sk2, pk2 = derive_epoch_keypair(bytearray(SEED), suite.value)
    assert pk == pk2 and sk.public_key() == pk
    assert len(public_key_bytes(pk)) == suite.public_key_len
    loaded = load_public_key(suite, public_key_bytes(pk))
    assert loaded == pk
    # the loaded key really is the same key: what it encrypts, the derived private key opens
    ct = suite.hpke.encrypt(b"x", loaded.hpke, b"i")
    assert suite.hpke.decrypt(ct, sk2.hpke, b"i") == b"x"
    assert derive_epoch_keypair(bytes(31) + b"\x01", suite)[1] != pk
    assert SEED.hex() not in repr(sk)


def test_suites_give_unrelated_x25519_keys() -> None:
    x = derive_epoch_keypair(SEED, EnvelopeSuite.X25519)[1].raw
    hybrid = derive_epoch_keypair(SEED, EnvelopeSuite.MLKEM768_X25519)[1].raw
    assert hybrid[-32:] != x


def _hkdf_sha256(ikm: bytes, info: bytes, length: int) -> bytes:
    """RFC 5869 written out with hmac, independent of the implementation under test."""
    prk = hmac.new(bytes(32), ikm, hashlib.sha256).digest()
    out, block, i = b"", b"", 1
    while len(out) < length:
        block = hmac.new(prk, block + info + bytes([i]), hashlib.sha256).digest()
        out, i = out + block, i + 1
    return out[:length]


def test_derivation_follows_the_documented_labels() -> None:
    for suite in (EnvelopeSuite.X25519, EnvelopeSuite.MLKEM768_X25519):
        base = b"verinfer/epoch-key/v1/" + suite.value.encode()
        x = x25519.X25519PrivateKey.from_private_bytes(_hkdf_sha256(SEED, base + b"/x25519", 32))
        want = x.public_key().public_bytes_raw()
        if suite is EnvelopeSuite.MLKEM768_X25519:
            m = mlkem.MLKEM768PrivateKey.from_seed_bytes(
                _hkdf_sha256(SEED, base + b"/mlkem768", 64))
            want = m.public_key().public_bytes_raw() + want
        assert derive_epoch_keypair(SEED, suite)[1].raw == want


def test_bad_inputs() -> None:
    with pytest.raises(ReceiptFormatError, match="32 bytes"):
        derive_epoch_keypair(bytes(31))
    with pytest.raises(ReceiptFormatError, match="32 bytes"):
        derive_epoch_keypair("00" * 32)  # type: ignore[arg-type]
    with pytest.raises(ReceiptFormatError, match="unknown envelope suite"):
        derive_epoch_keypair(SEED, "rsa")
    with pytest.raises(ReceiptFormatError, match="1216 bytes"):
        load_public_key(EnvelopeSuite.MLKEM768_X25519, bytes(32))
    with pytest.raises(ReceiptFormatError, match="invalid"):
        load_public_key(EnvelopeSuite.MLKEM768_X25519, b"\xff" * 1216)


def test_p256_key_is_the_seed_scalar() -> None:
    """The threshold suite's private key is s itself (so shares of s decapsulate)."""
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

    _priv, pub = derive_epoch_keypair(SEED, EnvelopeSuite.P256)
    want = ec.derive_private_key(int.from_bytes(SEED, "big"), ec.SECP256R1()).public_key()
    assert pub.raw == want.public_bytes(Encoding.X962, PublicFormat.UncompressedPoint)
    assert load_public_key(EnvelopeSuite.P256, pub.raw) == pub
    with pytest.raises(ReceiptFormatError):
        derive_epoch_keypair(b"\xff" * 32, EnvelopeSuite.P256)  # >= n
    with pytest.raises(ReceiptFormatError):
        load_public_key(EnvelopeSuite.P256, b"\x04" + bytes(64))
