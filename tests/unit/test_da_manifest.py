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
    decode_signed_receipt,
    encode_signed_receipt,
    inclusion_proof,
    parse_manifest,
)
from verinfer.da_client.pointer import Pointer
from verinfer.da_client.sample import SAMPLE_DOMAIN, sample_signed_receipt
from verinfer.receipts.eip712 import Domain
from verinfer.receipts.merkle import build_tree, verify_proof


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
    assert obj["leafCount"] == n and obj["format"] == "verinfer.batch-manifest/1"
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
    assert decode_signed_receipt(encode_signed_receipt(s)) == s
    with pytest.raises(ManifestError):
        decode_signed_receipt(b'{"receipt": {}}')


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
