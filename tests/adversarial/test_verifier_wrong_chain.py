"""Receipts for the wrong chain (issue 24 item 2): an operator on chain 31337 signs receipts that
name chainId 1 under its real EIP-712 domain. Off chain they used to verify; on chain every
dispute about them reverts with WrongChainId, so the operator could return anything unslashed.
Every verifier of a receipt must refuse them: the library, the manifest parser, the client
check (challenger reference parsing), and future-dated receipts/reports likewise (issuedAt)."""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import replace
from pathlib import Path

import pytest
import rfc8785

from verinfer.da_client.errors import ManifestError
from verinfer.da_client.manifest import (
    ManifestEntry,
    build_manifest,
    parse_manifest,
)
from verinfer.da_client.pointer import Pointer
from verinfer.receipts.eip712 import (
    MAX_ISSUED_AT_SKEW_S,
    Domain,
    Receipt,
    ReceiptSigner,
    check_issued_at,
    check_receipt_domain,
    verify_receipt,
)
from verinfer.receipts.errors import IssuedAtSkewError, SignatureError, WrongChainError
from verinfer.receipts.signed import SignedReceipt
from verinfer.verifier.challenger import signed_from_json
from verinfer.verifier.errors import ReceiptRefError

SIGNER = ReceiptSigner(hashlib.sha256(b"wrong-chain operator").digest())
CHAIN = 31337
DOMAIN = Domain(CHAIN, "0x5FbDB2315678afecb367f032d93F642f64180aa3")
BLOB = b"some envelope"


def _receipt(chain_id: int, issued_at: int = 1_800_000_000) -> Receipt:
    h = hashlib.sha256
    return Receipt(operator=SIGNER.address, chain_id=chain_id, model_id=h(b"m").digest(),
                   engine_fingerprint_hash=h(b"f").digest(), req_hash=h(b"q").digest(),
                   out_hash=h(b"o").digest(), key_epoch=1, ciphertext_hash=h(BLOB).digest(),
                   issued_at=issued_at)


def _wrong() -> SignedReceipt:
    """What the attacker serves: chainId 1 in the receipt, signed under chain 31337's domain."""
    return SignedReceipt.sign(_receipt(1), DOMAIN, SIGNER)


def test_library_refuses_a_receipt_for_another_chain() -> None:
    s = _wrong()
    with pytest.raises(WrongChainError):
        verify_receipt(s.receipt, DOMAIN, s.signature)
    with pytest.raises(SignatureError):  # WrongChainError is a SignatureError: old callers hold
        s.verify()
    with pytest.raises(WrongChainError):
        check_receipt_domain(s.receipt, DOMAIN)
    good = SignedReceipt.sign(_receipt(CHAIN), DOMAIN, SIGNER)
    assert good.verify(chain_id=CHAIN) == SIGNER.address
    with pytest.raises(WrongChainError):  # right domain, but not the chain being read
        good.verify(chain_id=1)


def test_manifest_parser_refuses_a_batch_with_a_wrong_chain_receipt() -> None:
    entries = [ManifestEntry(SignedReceipt.sign(_receipt(CHAIN), DOMAIN, SIGNER),
                             Pointer.for_blob("local", BLOB)),
               ManifestEntry(_wrong(), Pointer.for_blob("local", BLOB))]
    m = build_manifest(entries)  # what a dishonest operator publishes
    with pytest.raises(ManifestError, match="chainId"):
        m.verify_signatures(DOMAIN)
    with pytest.raises(ManifestError, match="chainId"):
        parse_manifest(m.to_bytes(), DOMAIN)
    with pytest.raises(WrongChainError, match="chainId"):
        SignedReceipt.from_bytes(rfc8785.dumps(_wrong().to_json()))


@pytest.mark.parametrize("form", ["api_response", "verification", "signed", "manifest_entry"])
def test_client_check_refuses_a_receipt_for_another_chain(form: str) -> None:
    s = _wrong()
    verification = {"receipt": s.receipt.as_typed_data(DOMAIN),
                    "signature": "0x" + s.signature.hex(), "receipt_id": "0x" + s.digest.hex()}
    doc = {"api_response": {"id": "chatcmpl-1", "verification": verification},
           "verification": verification,
           "signed": s.to_json(),
           "manifest_entry": {"receipt": s.receipt.to_json(),
                              "signature": "0x" + s.signature.hex()}}[form]
    with pytest.raises((ReceiptRefError, WrongChainError), match="chainId"):
        signed_from_json(json.loads(json.dumps(doc)), DOMAIN)


def test_future_receipts_and_reports_are_refused_and_2_64_does_not_overflow() -> None:
    # clients refuse exactly what the chain slashes: the contract's constant, read from its source
    sol = (Path(__file__).resolve().parents[2] / "contracts" / "src" / "ChallengeManager.sol")
    m = re.search(r"MAX_CLOCK_SKEW = (\d+) minutes;", sol.read_text())
    assert m is not None and int(m.group(1)) * 60 == MAX_ISSUED_AT_SKEW_S
    now = 1_800_000_000
    check_issued_at(now + MAX_ISSUED_AT_SKEW_S, now)  # clock drift within the skew is fine
    for far in (now + MAX_ISSUED_AT_SKEW_S + 1, 2**64 - 1):
        with pytest.raises(IssuedAtSkewError):
            check_issued_at(far, now)
    s = SignedReceipt.sign(replace(_receipt(CHAIN), issued_at=2**64 - 1), DOMAIN, SIGNER)
    assert s.verify() == SIGNER.address  # the signature is fine: the date is what is refused
