"""An operator whose keys are named, not random: the EvidenceFactory a test makes receipts with
when any key will do but the run should be repeatable (same name -> same operator key, same
X25519 epoch key pair, same clock), so a failure reproduces byte for byte."""

from __future__ import annotations

import hashlib

from verinfer.engine.engine import Engine
from verinfer.receipts.eip712 import Domain, ReceiptSigner
from verinfer.receipts.epoch_keys import EnvelopeSuite, EpochPrivateKey, derive_epoch_keypair
from verinfer.testing.evidence import EvidenceFactory

# anvil's chain id and a placeholder registry: the receipts are checked off chain
TEST_DOMAIN = Domain(31337, "0x" + "11" * 20)
FIXED_NOW = 1_800_000_000  # a fixed issue time: receipts do not depend on the wall clock


def fixed_operator(engine: Engine, name: str, *, key_epoch: int
                   ) -> tuple[EvidenceFactory, EpochPrivateKey]:
    """The factory of the operator called ``name`` (signing key sha256("<name> operator"),
    epoch key pair derived from sha256("<name> epoch")), and the epoch's private key, which
    a verifier or auditor opens its envelopes with."""
    sk, pk = derive_epoch_keypair(hashlib.sha256(f"{name} epoch".encode()).digest(),
                                  EnvelopeSuite.X25519)
    factory = EvidenceFactory(
        engine,
        ReceiptSigner(hashlib.sha256(f"{name} operator".encode()).digest()),
        TEST_DOMAIN,
        key_epoch=key_epoch,
        epoch_public_key=pk,
        now=lambda: FIXED_NOW,
    )
    return factory, sk
