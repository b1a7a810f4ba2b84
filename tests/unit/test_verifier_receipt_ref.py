"""`verinfer challenge <file>` accepts every form a client holds: an API response, its
`verification` object (EIP-712 typed data), a bare SignedReceipt, a manifest entry; anything
else, a receipt for another chain, a wrong receipt id or a forged signature is refused."""

from __future__ import annotations

import copy
import hashlib
from typing import Any

import pytest

from verinfer.receipts.eip712 import Domain, Receipt, ReceiptSigner
from verinfer.receipts.errors import SignatureError
from verinfer.receipts.signed import SignedReceipt
from verinfer.verifier.challenger import signed_from_json
from verinfer.verifier.errors import ReceiptRefError

SIGNER = ReceiptSigner(hashlib.sha256(b"receipt ref operator").digest())
DOMAIN = Domain(31337, "0xCf7Ed3AccA5a467e9e704C703E8D87F634fB0Fc9")


def _signed(domain: Domain = DOMAIN) -> SignedReceipt:
    r = Receipt.create(operator=SIGNER.address, chain_id=domain.chain_id,
                       model_id=b"\x01" * 32, engine_fingerprint_hash=b"\x02" * 32,
                       req_hash=b"\x03" * 32, out_hash=b"\x04" * 32, key_epoch=1,
                       ciphertext_hash=b"\x05" * 32, now=lambda: 1_800_000_000)
    return SignedReceipt.sign(r, domain, SIGNER)


def _verification(s: SignedReceipt) -> dict[str, Any]:
    """The shape verinfer.operator returns (docs/operator.md)."""
    return {"version": 1, "receipt_id": "0x" + s.digest.hex(),
            "receipt": s.receipt.as_typed_data(s.domain), "signature": "0x" + s.signature.hex(),
            "operator": SIGNER.address, "req_hash": "0x" + "03" * 32,
            "out_hash": "0x" + "04" * 32, "seed": 7, "da_pointer": "da://local/0x" + "05" * 32}


@pytest.mark.parametrize("form", ["verification", "response", "signed", "manifest_entry"])
def test_every_client_form_gives_the_same_receipt(form: str) -> None:
    s = _signed()
    doc: dict[str, Any] = {
        "verification": _verification(s),
        "response": {"id": "chatcmpl-1", "choices": [], "verification": _verification(s)},
        "signed": s.to_json(),
        "manifest_entry": {"receipt": s.receipt.to_json(), "signature": "0x" + s.signature.hex(),
                           "receiptDigest": "0x" + s.digest.hex()},
    }[form]
    got = signed_from_json(doc, DOMAIN)
    assert got == s and got.digest == s.digest


def test_receipt_for_another_chain_is_refused() -> None:
    other = _signed(Domain(1, DOMAIN.verifying_contract))
    with pytest.raises(ReceiptRefError, match="not for this chain"):
        signed_from_json(_verification(other), DOMAIN)


def test_wrong_receipt_id_is_refused() -> None:
    v = _verification(_signed())
    v["receipt_id"] = "0x" + "ab" * 32
    with pytest.raises(ReceiptRefError, match="does not match"):
        signed_from_json(v, DOMAIN)


def test_edited_message_no_longer_recovers_to_the_operator() -> None:
    v = copy.deepcopy(_verification(_signed()))
    v["receipt"]["message"]["outHash"] = "0x" + "99" * 32
    del v["receipt_id"]
    with pytest.raises(SignatureError):
        signed_from_json(v, DOMAIN)


@pytest.mark.parametrize("doc", [
    {"choices": []}, [1, 2], "0x00",
    {"receipt": {"domain": {}, "types": {}, "primaryType": "Mail", "message": {}},
     "signature": "0x"},
    {"receipt": {"domain": {}, "types": [], "primaryType": "Receipt", "message": {}},
     "signature": "0x"},
])
def test_other_documents_are_refused_with_a_typed_error(doc: Any) -> None:
    with pytest.raises(ReceiptRefError):
        signed_from_json(doc, DOMAIN)
