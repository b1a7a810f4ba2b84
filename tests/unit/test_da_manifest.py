from __future__ import annotations

import json
import os

import pytest
import rfc8785
from hypothesis import given, settings
from hypothesis import strategies as st

from verinfer.da_client.errors import ManifestError
from verinfer.da_client.manifest import (
    ManifestEntry,
    build_manifest,
    inclusion_proof,
    parse_manifest,
)
from verinfer.da_client.pointer import Pointer
from verinfer.protocol.errors import ReceiptFormatError
from verinfer.receipts.eip712 import Domain
from verinfer.receipts.merkle import build_tree, verify_proof
from verinfer.receipts.signed import SignedReceipt
from verinfer.testing.sample import SAMPLE_DOMAIN, sample_signed_receipt

OTHER_DOMAIN = Domain(1, SAMPLE_DOMAIN.verifying_contract)

# Written by the code before manifests named their EIP-712 domain (commit b097a2b; format 1,
# never shipped, no longer read): a one-entry batch and that receipt's old outbox bytes.
LEGACY_MANIFEST = (
    b'{"batchRoot":"0xe3d548fe53c18d89d9c10d3fc8691aa2bcf96d0c591e3d8fc10649dd49912f82","entri'
    b'es":[{"ciphertext":"da://local/0x57c686be41c66320bb8f451068c4176d51c708594aa82f9ec3e3241'
    b'94fae11e6","receipt":{"chainId":31337,"ciphertextHash":"0x57c686be41c66320bb8f451068c417'
    b'6d51c708594aa82f9ec3e324194fae11e6","engineFingerprintHash":"0xc5a5a4135b13070d6bdf27a7f'
    b'1b8958184eb69b9d57e2e360dd23250f98a4b8f","issuedAt":1700000000,"keyEpoch":1,"modelId":"0'
    b'x58ef8f4b1904b2ce3cdaf95f54e1a688ceac8646cfa79a14a12b242691e1937d","operator":"0xf39Fd6e'
    b'51aad88F6F4ce6aB8827279cffFb92266","outHash":"0x67d37071e5038422deb602aa7e39a00fa9bfbeef'
    b'c68331ea4f93a46d6c5ef9c4","reqHash":"0x673529f20f252c62c41c7e4cda07cc9b9fcdc7bb1766da090'
    b'7d50812fbf2370b","version":1},"receiptDigest":"0x63f6918da77b3e8a38fcb0ef022e0641178b681'
    b'8f81269247e4611a2a4fb4b73","signature":"0x9fe63140f7a23e5df8ba760d3c1fa2b65dc8e0660d3abe'
    b'3f8465838a01bb00924e300519d507e95eefefee43186cccc30dac4447bb1cb84e76b707a64845b6251b"}],'
    b'"format":"verinfer.batch-manifest/1","leafCount":1}'
)
LEGACY_RECEIPT = (
    b'{"receipt":{"chainId":31337,"ciphertextHash":"0x57c686be41c66320bb8f451068c4176d51c70859'
    b'4aa82f9ec3e324194fae11e6","engineFingerprintHash":"0xc5a5a4135b13070d6bdf27a7f1b8958184e'
    b'b69b9d57e2e360dd23250f98a4b8f","issuedAt":1700000000,"keyEpoch":1,"modelId":"0x58ef8f4b1'
    b'904b2ce3cdaf95f54e1a688ceac8646cfa79a14a12b242691e1937d","operator":"0xf39Fd6e51aad88F6F'
    b'4ce6aB8827279cffFb92266","outHash":"0x67d37071e5038422deb602aa7e39a00fa9bfbeefc68331ea4f'
    b'93a46d6c5ef9c4","reqHash":"0x673529f20f252c62c41c7e4cda07cc9b9fcdc7bb1766da0907d50812fbf'
    b'2370b","version":1},"receiptDigest":"0x63f6918da77b3e8a38fcb0ef022e0641178b6818f81269247'
    b'e4611a2a4fb4b73","signature":"0x9fe63140f7a23e5df8ba760d3c1fa2b65dc8e0660d3abe3f8465838a'
    b'01bb00924e300519d507e95eefefee43186cccc30dac4447bb1cb84e76b707a64845b6251b"}'
)


def _entries(n: int) -> list[ManifestEntry]:
    out = []
    for i in range(n):
        payload = os.urandom(64) + bytes([i])
        out.append(ManifestEntry(sample_signed_receipt(payload, issued_at=1_700_000_000 + i),
                                 Pointer.for_blob("local", payload)))
    return out


@pytest.mark.parametrize("n", [1, 2, 3, 7, 16])
def test_round_trip_and_proofs(n: int) -> None:
    m = build_manifest(_entries(n))
    data = m.to_bytes()
    assert parse_manifest(data) == m
    obj = json.loads(data)
    assert obj["leafCount"] == n and obj["format"] == "verinfer.batch-manifest/2"
    assert obj["batchRoot"] == "0x" + build_tree(list(m.digests)).root.hex()
    for i, d in enumerate(m.digests):
        proof = inclusion_proof(data, d)
        assert proof.index == i and proof.leaf_count == n
        assert verify_proof(d, proof, m.root)
    m.verify_signatures(SAMPLE_DOMAIN)


def test_digest_not_in_batch() -> None:
    m = build_manifest(_entries(3))
    with pytest.raises(ManifestError, match="not in batch"):
        inclusion_proof(m, bytes(32))


def _tampered(data: bytes, edit: object) -> bytes:
    obj = json.loads(data)
    edit(obj)  # type: ignore[operator]
    return bytes(rfc8785.dumps(obj))


def _swap(o: dict) -> None:  # type: ignore[type-arg]
    o["entries"].reverse()


@pytest.mark.parametrize("edit, match", [
    (lambda o: o.__setitem__("batchRoot", "0x" + "00" * 32), "does not match"),
    (lambda o: o.__setitem__("leafCount", 4), "leafCount"),
    (_swap, "does not match"),
    (lambda o: o["entries"][0].__setitem__("receiptDigest", "0x" + "11" * 32), "does not match"),
    (lambda o: o["entries"][0].__setitem__("ciphertext", "da://local/0x" + "22" * 32),
     "ciphertextHash"),
    (lambda o: o["entries"][0].__setitem__("ciphertext", "da://nowhere/0x00"), "ciphertext"),
    (lambda o: o["entries"][0].__setitem__("signature", "0x00"), "signature"),
    (lambda o: o["entries"][0]["receipt"].__setitem__("keyEpoch", -1), "keyEpoch"),
    (lambda o: o.__setitem__("format", "other/1"), "format"),
    (lambda o: o.__setitem__("extra", 1), "keys"),
    (lambda o: o.__setitem__("entries", []), "non-empty"),
    # a domain for another chain than the receipts name: refused by the chain rule first
    (lambda o: o["domain"].__setitem__("chainId", 1), "signed under a domain for chainId 1"),
    (lambda o: o["domain"].__setitem__("name", "other"), "not a verinfer v1 domain"),
    (lambda o: o.__delitem__("domain"), "manifest keys must be"),
])
def test_tampered_manifests_are_rejected(edit: object, match: str) -> None:
    data = build_manifest(_entries(3)).to_bytes()
    with pytest.raises(ManifestError, match=match):
        parse_manifest(_tampered(data, edit))


def test_duplicate_entry_rejected() -> None:
    e = _entries(1)[0]
    with pytest.raises(ManifestError, match="twice"):
        build_manifest([e, e])
    with pytest.raises(ManifestError, match="empty"):
        build_manifest([])


def test_non_canonical_bytes_rejected() -> None:
    data = build_manifest(_entries(2)).to_bytes()
    pretty = json.dumps(json.loads(data), indent=1).encode()
    with pytest.raises(ManifestError, match="canonical"):
        parse_manifest(pretty)
    with pytest.raises(ManifestError, match="JSON"):
        parse_manifest(b"\xff\xfe")


def test_signature_check_catches_wrong_domain_and_signer() -> None:
    m = build_manifest(_entries(2))
    with pytest.raises(ManifestError, match="EIP-712 digest"):
        m.verify_signatures(Domain(1, SAMPLE_DOMAIN.verifying_contract))


def test_signed_receipt_wire_form() -> None:
    s = sample_signed_receipt(b"payload")
    assert SignedReceipt.from_bytes(s.to_bytes()) == s
    with pytest.raises(ReceiptFormatError, match="exactly digest, domain, receipt, signature"):
        SignedReceipt.from_bytes(b'{"receipt": {}}')
    with pytest.raises(ReceiptFormatError, match="depth"):
        SignedReceipt.from_bytes(b"[" * 100 + b"]" * 100)


def test_manifest_names_its_domain_and_holds_receipts_signed_receipts() -> None:
    m = build_manifest(_entries(2))
    data = m.to_bytes()
    assert json.loads(data)["domain"] == SAMPLE_DOMAIN.to_json()
    got = parse_manifest(data)
    assert got.domain == SAMPLE_DOMAIN
    assert all(type(e.signed) is SignedReceipt for e in got.entries)
    assert parse_manifest(data, SAMPLE_DOMAIN) == got == m


def test_manifest_for_another_domain_is_rejected() -> None:
    data = build_manifest(_entries(2)).to_bytes()
    with pytest.raises(ManifestError, match="not the expected"):
        parse_manifest(data, OTHER_DOMAIN)


def test_format_1_manifest_without_domain_is_refused_by_its_format() -> None:
    for domain in (None, SAMPLE_DOMAIN):
        with pytest.raises(ManifestError, match=r"unknown manifest format '.*batch-manifest/1'"):
            parse_manifest(LEGACY_MANIFEST, domain)
    # the old shape under the new format string: refused for its keys, not read domainless
    relabelled = LEGACY_MANIFEST.replace(b"batch-manifest/1", b"batch-manifest/2")
    with pytest.raises(ManifestError, match="manifest keys must be"):
        parse_manifest(relabelled, SAMPLE_DOMAIN)


def test_a_batch_has_one_domain() -> None:
    payload = b"other chain"
    other = ManifestEntry(sample_signed_receipt(payload, domain=OTHER_DOMAIN),
                          Pointer.for_blob("local", payload))
    with pytest.raises(ManifestError, match="one EIP-712 domain"):
        build_manifest([*_entries(1), other])


def test_outbox_receipt_bytes_are_the_signed_receipt_json() -> None:
    s = sample_signed_receipt(b"payload")
    assert s.to_bytes() == rfc8785.dumps(s.to_json())
    with pytest.raises(ReceiptFormatError, match="digest"):
        SignedReceipt.from_bytes(rfc8785.dumps({**s.to_json(), "digest": "0x" + "00" * 32}))


def test_outbox_receipt_bytes_without_domain_are_refused() -> None:
    with pytest.raises(ReceiptFormatError, match="exactly digest, domain, receipt, signature"):
        SignedReceipt.from_bytes(LEGACY_RECEIPT)


_M3 = build_manifest(_entries(3)).to_bytes()


@settings(max_examples=80, deadline=None)
@given(st.integers(min_value=0, max_value=len(_M3) - 1), st.integers(min_value=1, max_value=255))
def test_any_single_byte_change_is_caught(pos: int, delta: int) -> None:
    """Parsing catches structure, root and pointer changes; the signature check catches the
    rest (signatures are not under the Merkle root). Nothing altered passes both."""
    data = bytearray(_M3)
    data[pos] = (data[pos] + delta) % 256
    try:
        m = parse_manifest(bytes(data))
        m.verify_signatures(SAMPLE_DOMAIN)
    except ManifestError:
        return
    pytest.fail(f"byte {pos} changed by {delta} was accepted: {bytes(data)[pos - 20:pos + 20]!r}")


@settings(max_examples=25, deadline=None)
@given(st.integers(min_value=1, max_value=40), st.data())
def test_proofs_verify_for_every_batch_size(n: int, data: st.DataObject) -> None:
    m = build_manifest(_entries(n))
    i = data.draw(st.integers(min_value=0, max_value=n - 1))
    proof = inclusion_proof(m.to_bytes(), m.digests[i])
    assert proof.index == i and verify_proof(m.digests[i], proof, m.root)
    assert not verify_proof(m.digests[(i + 1) % n], proof, m.root) or n == 1
