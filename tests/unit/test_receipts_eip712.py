"""EIP-712 receipts: our digest equals eth-account's, signatures recover the operator only
for the domain they were made for, and malformed fields raise typed errors."""

from __future__ import annotations

import hashlib
from typing import Any

import pytest
from eth_account import Account
from eth_account.messages import _hash_eip191_message, encode_typed_data
from hypothesis import given, settings
from hypothesis import strategies as st

from verinfer.protocol.errors import ReceiptFormatError, UnsupportedVersionError
from verinfer.receipts.eip712 import (
    RECEIPT_FIELDS,
    Domain,
    Receipt,
    address_of,
    recover_signer,
    sign_digest,
    sign_receipt,
    verify_receipt,
)
from verinfer.receipts.errors import SignatureError

KEY = hashlib.sha256(b"operator key").digest()
OTHER_KEY = hashlib.sha256(b"someone else").digest()
DOMAIN = Domain(31337, "0x5FbDB2315678afecb367f032d93F642f64180aa3")


def h(label: str) -> bytes:
    return hashlib.sha256(label.encode()).digest()


def make_receipt(**over: Any) -> Receipt:
    kw: dict[str, Any] = dict(operator=address_of(KEY), chain_id=31337, model_id=h("m"),
                              engine_fingerprint_hash=h("e"), req_hash=h("q"), out_hash=h("o"),
                              key_epoch=3, ciphertext_hash=h("c"), issued_at=1_700_000_000)
    kw.update(over)
    return Receipt(**kw)


b32 = st.binary(min_size=32, max_size=32)
receipts = st.builds(
    Receipt, operator=st.just(address_of(KEY)), chain_id=st.integers(0, 2**256 - 1),
    model_id=b32, engine_fingerprint_hash=b32, req_hash=b32, out_hash=b32,
    key_epoch=st.integers(0, 2**64 - 1), ciphertext_hash=b32, issued_at=st.integers(0, 2**64 - 1))


@settings(max_examples=25, deadline=None)
@given(receipts, st.integers(1, 2**64), b32)
def test_digest_equals_eth_account(receipt: Receipt, chain_id: int, contract: bytes) -> None:
    domain = Domain(chain_id, "0x" + contract[:20].hex())
    theirs = _hash_eip191_message(encode_typed_data(full_message=receipt.as_typed_data(domain)))
    assert receipt.digest(domain) == theirs


@settings(max_examples=25, deadline=None)
@given(receipts)
def test_signature_recovers_operator_and_matches_eth_account(receipt: Receipt) -> None:
    dom = Domain(receipt.chain_id, DOMAIN.verifying_contract)  # the receipt's own chain
    sig = sign_receipt(receipt, dom, KEY)
    assert len(sig) == 65 and sig[64] in (27, 28)
    assert recover_signer(receipt, dom, sig) == receipt.operator
    assert verify_receipt(receipt, dom, sig, receipt.operator) == receipt.operator
    signed = Account.sign_typed_data(KEY, full_message=receipt.as_typed_data(dom))
    assert bytes(signed.signature) == sig
    assert Account.recover_message(encode_typed_data(full_message=receipt.as_typed_data(dom)),
                                   signature=sig) == receipt.operator


def test_signature_is_bound_to_chain_and_contract() -> None:
    r = make_receipt()
    sig = sign_receipt(r, DOMAIN, KEY)
    for other in (Domain(1, DOMAIN.verifying_contract),
                  Domain(31337, "0xe7f1725E7734CE288F8367e1Bb143E90bb3F0512")):
        assert recover_signer(r, other, sig) != r.operator
        # another chain fails the chain rule first, another contract the recovery
        with pytest.raises(SignatureError, match=r"not the operator|chainId"):
            verify_receipt(r, other, sig, r.operator)


@pytest.mark.parametrize("attr", [a for _, _, a in RECEIPT_FIELDS if a not in ("version",
                                                                               "operator")])
def test_every_field_changes_the_digest(attr: str) -> None:
    r = make_receipt()
    v = getattr(r, attr)
    changed = (bytes([v[0] ^ 0x80]) + v[1:]) if isinstance(v, bytes) else v + 1
    r2 = make_receipt(**{attr: changed})
    assert r2.digest(DOMAIN) != r.digest(DOMAIN)
    with pytest.raises(SignatureError):
        verify_receipt(r2, DOMAIN, sign_receipt(r, DOMAIN, KEY))


def test_wrong_operator_and_tampered_signature() -> None:
    r = make_receipt()
    sig = sign_receipt(r, DOMAIN, KEY)
    with pytest.raises(SignatureError, match="expected"):
        verify_receipt(r, DOMAIN, sig, address_of(OTHER_KEY))
    with pytest.raises(SignatureError, match="not the receipt's operator"):
        sign_receipt(r, DOMAIN, OTHER_KEY)
    forged = sign_digest(r.digest(DOMAIN), OTHER_KEY)
    with pytest.raises(SignatureError, match="recovers"):
        verify_receipt(r, DOMAIN, forged)
    with pytest.raises(SignatureError, match="65 bytes"):
        verify_receipt(r, DOMAIN, sig[:64])
    with pytest.raises(SignatureError, match="v must be"):
        verify_receipt(r, DOMAIN, sig[:64] + b"\x01")
    n = 0xFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFEBAAEDCE6AF48A03BBFD25E8CD0364141
    high_s = sig[:32] + (n - int.from_bytes(sig[32:64], "big")).to_bytes(32, "big") + \
        bytes([55 - sig[64]])
    with pytest.raises(SignatureError, match="high-s"):
        verify_receipt(r, DOMAIN, high_s)


def test_json_round_trip_and_bad_fields() -> None:
    r = make_receipt()
    assert Receipt.from_json(r.to_json()) == r
    good = r.to_json()
    bad_cases: list[tuple[str, object, type[Exception]]] = [
        ("modelId", "0x1234", ReceiptFormatError),
        ("modelId", "1234" * 16, ReceiptFormatError),
        ("reqHash", "0x" + "zz" * 32, ReceiptFormatError),
        ("operator", "0x" + "ab" * 19, ReceiptFormatError),
        ("operator", good["operator"][:3] + good["operator"][3:].swapcase(), ReceiptFormatError),
        ("keyEpoch", 2**64, ReceiptFormatError),
        ("keyEpoch", -1, ReceiptFormatError),
        ("issuedAt", "5", ReceiptFormatError),
        ("version", 2, UnsupportedVersionError),
        ("version", True, ReceiptFormatError),
    ]
    for field, value, err in bad_cases:
        with pytest.raises(err) as exc:
            Receipt.from_json({**good, field: value})
        assert repr(value)[:20] in exc.value.message or field == "version"
    with pytest.raises(ReceiptFormatError, match="exactly"):
        Receipt.from_json({**good, "extra": 1})
    with pytest.raises(ReceiptFormatError):
        Domain(1, "not an address")


def test_issued_at_comes_from_the_injected_clock() -> None:
    r = Receipt.create(operator=address_of(KEY), chain_id=1, model_id=h("m"),
                       engine_fingerprint_hash=h("e"), req_hash=h("q"), out_hash=h("o"),
                       key_epoch=1, ciphertext_hash=h("c"), now=lambda: 1234.9)
    assert r.issued_at == 1234


@settings(max_examples=25, deadline=None)
@given(receipts, st.integers(0, 2**256 - 1), st.integers(0, 2**256 - 1),
       st.binary(min_size=20, max_size=20), st.binary(min_size=20, max_size=20))
def test_signature_for_one_domain_never_verifies_in_another(
        receipt: Receipt, chain_a: int, chain_b: int, contract_a: bytes,
        contract_b: bytes) -> None:
    chain_a = receipt.chain_id  # a receipt verifies only under a domain for its own chain
    a = Domain(chain_a, "0x" + contract_a.hex())
    b = Domain(chain_b, "0x" + contract_b.hex())
    sig = sign_receipt(receipt, a, KEY)
    assert verify_receipt(receipt, a, sig) == receipt.operator
    if (chain_a, contract_a) != (chain_b, contract_b):
        with pytest.raises(SignatureError):
            verify_receipt(receipt, b, sig)
