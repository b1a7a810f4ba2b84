"""The epoch's HPKE app key pair, derived from the reconstructed epoch secret s (legacy suites;
a P256 epoch's key is s itself and is never reconstructed, kms/tdh.py).

seed = s.to_bytes(32, "big"); the derivation itself belongs to the receipts part
(``derive_epoch_keypair``), so the operator's envelopes and the KMS agree by construction.
"""

from __future__ import annotations

from verinfer.kms.errors import InvalidShareError
from verinfer.kms.shamir import Q
from verinfer.receipts.epoch_keys import (
    EnvelopeSuite,
    EpochPrivateKey,
    EpochPublicKey,
    derive_epoch_keypair,
)

#: New epochs: the per-receipt threshold suite (docs/kms.md §8); the key is never rebuilt.
DEFAULT_SUITE = EnvelopeSuite.P256.value
#: The suite whose app key the enclave rebuilds from released shares (old epochs, tests of
#: the share-release path).
LEGACY_SUITE = EnvelopeSuite.X25519.value
SUITES = tuple(s.value for s in EnvelopeSuite)

__all__ = ["DEFAULT_SUITE", "LEGACY_SUITE", "SUITES", "app_keypair", "parse_suite",
           "seed_from_secret"]


def parse_suite(name: str) -> str:
    if name not in SUITES:
        raise InvalidShareError(f"unknown HPKE suite {name!r}; known: {list(SUITES)}")
    return name


def seed_from_secret(secret: int) -> bytearray:
    """32-byte big-endian seed in a bytearray so the caller can overwrite it."""
    if not 1 <= secret < Q:
        raise InvalidShareError("epoch secret out of range [1, q)")
    return bytearray(secret.to_bytes(32, "big"))


def app_keypair(seed: bytes | bytearray, suite: str) -> tuple[EpochPrivateKey, EpochPublicKey]:
    # A bytearray goes in as is: no extra immutable copy of the seed on our side.
    return derive_epoch_keypair(seed, parse_suite(suite))  # type: ignore[arg-type, unused-ignore]
