"""Batch manifests: the receipts of one Merkle batch, published as one canonical-JSON blob.

Format (RFC 8785 canonical JSON, UTF-8; keys sorted by the canonicalization)::

    {"batchRoot": "0x<32 bytes>", "entries": [<entry>, ...],
     "format": "verinfer.batch-manifest/1", "leafCount": <n>}
    entry = {"ciphertext": "da://<backend>/0x<hex>", "receipt": {<Receipt typed fields>},
             "receiptDigest": "0x<32 bytes>", "signature": "0x<65 bytes>"}

Entries are in leaf order; ``batchRoot`` is the root of ``verinfer.receipts.merkle`` over the
receipt digests; each receipt's ``ciphertextHash`` equals the sha256 its pointer names. Parsing
rejects anything else, including a non-canonical spelling of the same content, so a manifest's
bytes (and hence its DA pointer) are a function of its content.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import rfc8785

from verinfer.da_client.errors import MalformedPointerError, ManifestError
from verinfer.da_client.pointer import Pointer
from verinfer.receipts.eip712 import Domain, Receipt, recover_digest_signer
from verinfer.receipts.errors import MerkleError, ReceiptFormatError, SignatureError
from verinfer.receipts.merkle import MerkleProof, build_tree

MANIFEST_FORMAT = "verinfer.batch-manifest/1"
SIGNATURE_LEN = 65


@dataclass(frozen=True)
class SignedReceipt:
    """A receipt, its 32-byte EIP-712 digest and the operator's 65-byte signature."""

    receipt: Receipt
    digest: bytes
    signature: bytes

    def __post_init__(self) -> None:
        _check_len(self.digest, 32, "receiptDigest")
        _check_len(self.signature, SIGNATURE_LEN, "signature")


@dataclass(frozen=True)
class ManifestEntry:
    signed: SignedReceipt
    ciphertext: Pointer

    def __post_init__(self) -> None:
        want = self.signed.receipt.ciphertext_hash
        if self.ciphertext.blob_sha256 != want:
            raise ManifestError(
                f"receipt 0x{self.signed.digest.hex()} has ciphertextHash 0x{want.hex()} but "
                f"its pointer names sha256 0x{self.ciphertext.blob_sha256.hex()}",
                param="ciphertext")

    def to_json(self) -> dict[str, Any]:
        return {"ciphertext": str(self.ciphertext), "receipt": self.signed.receipt.to_json(),
                "receiptDigest": "0x" + self.signed.digest.hex(),
                "signature": "0x" + self.signed.signature.hex()}


@dataclass(frozen=True)
class BatchManifest:
    root: bytes
    entries: tuple[ManifestEntry, ...]

    @property
    def leaf_count(self) -> int:
        return len(self.entries)

    @property
    def digests(self) -> tuple[bytes, ...]:
        return tuple(e.signed.digest for e in self.entries)

    def to_json(self) -> dict[str, Any]:
        return {"batchRoot": "0x" + self.root.hex(), "entries": [e.to_json() for e in self.entries],
                "format": MANIFEST_FORMAT, "leafCount": self.leaf_count}

    def to_bytes(self) -> bytes:
        try:
            return bytes(rfc8785.dumps(self.to_json()))
        except rfc8785.CanonicalizationError as e:  # e.g. a chainId beyond 2^53 - 1
            raise ManifestError(f"manifest cannot be canonicalized: {e}") from e

    def index_of(self, digest: bytes) -> int:
        for i, d in enumerate(self.digests):
            if d == digest:
                return i
        raise ManifestError(f"receipt 0x{digest.hex()} is not in batch 0x{self.root.hex()}",
                            param="receipt_digest")

    def proof(self, digest: bytes) -> MerkleProof:
        """The inclusion proof of one receipt (by digest) under ``root``."""
        return build_tree(self.digests).proof(self.index_of(digest))

    def verify_signatures(self, domain: Domain) -> None:
        """Check every digest is the receipt's EIP-712 digest under ``domain`` and every
        signature recovers to the receipt's operator; raise ManifestError naming the first bad
        entry."""
        for i, e in enumerate(self.entries):
            r = e.signed.receipt
            if r.digest(domain) != e.signed.digest:
                raise ManifestError(f"entry {i}: receiptDigest 0x{e.signed.digest.hex()} is not "
                                    f"the EIP-712 digest of its receipt under {domain}")
            try:
                signer = recover_digest_signer(e.signed.digest, e.signed.signature)
            except SignatureError as err:
                raise ManifestError(f"entry {i}: {err.message}") from err
            if signer != r.operator:
                raise ManifestError(f"entry {i}: signature recovers {signer}, not the operator "
                                    f"{r.operator}")


def build_manifest(entries: Sequence[ManifestEntry]) -> BatchManifest:
    if not entries:
        raise ManifestError("an empty batch has no manifest")
    digests = [e.signed.digest for e in entries]
    _check_unique(digests)
    return BatchManifest(build_tree(digests).root, tuple(entries))


def parse_manifest(data: bytes) -> BatchManifest:
    """Parse and fully validate manifest bytes (canonical form, root, pointers, receipts)."""
    try:
        obj = json.loads(data)
    except (ValueError, UnicodeDecodeError) as e:
        raise ManifestError(f"manifest is not UTF-8 JSON: {e}") from e
    if not isinstance(obj, dict):
        raise ManifestError(f"manifest must be a JSON object, got {type(obj).__name__}")
    keys = {"batchRoot", "entries", "format", "leafCount"}
    if set(obj) != keys:
        raise ManifestError(f"manifest keys must be {sorted(keys)}, got {sorted(obj)}")
    if obj["format"] != MANIFEST_FORMAT:
        raise ManifestError(f"unknown manifest format {obj['format']!r}", param="format")
    raw_entries = obj["entries"]
    if not isinstance(raw_entries, list) or not raw_entries:
        raise ManifestError("manifest entries must be a non-empty list", param="entries")
    count = obj["leafCount"]
    if isinstance(count, bool) or not isinstance(count, int) or count != len(raw_entries):
        raise ManifestError(f"leafCount {count!r} does not match {len(raw_entries)} entries",
                            param="leafCount")
    entries = tuple(_parse_entry(i, e) for i, e in enumerate(raw_entries))
    root = _parse_hex32(obj["batchRoot"], "batchRoot")
    try:
        manifest = build_manifest(entries)
    except MerkleError as e:
        raise ManifestError(e.message) from e
    if manifest.root != root:
        raise ManifestError(f"batchRoot 0x{root.hex()} does not match the entries' root "
                            f"0x{manifest.root.hex()}", param="batchRoot")
    if manifest.to_bytes() != bytes(data):
        raise ManifestError("manifest is not in canonical (RFC 8785) form")
    return manifest


def inclusion_proof(manifest: bytes | BatchManifest, receipt_digest: bytes) -> MerkleProof:
    """One receipt's Merkle inclusion proof, from a manifest (bytes are parsed and checked)."""
    m = parse_manifest(manifest) if isinstance(manifest, bytes | bytearray) else manifest
    return m.proof(receipt_digest)


# ---- signed receipt wire form (the outbox's default receipt bytes) -----------------------------
def encode_signed_receipt(signed: SignedReceipt) -> bytes:
    """Canonical JSON ``{"receipt": {...}, "receiptDigest": "0x..", "signature": "0x.."}``."""
    return bytes(rfc8785.dumps({"receipt": signed.receipt.to_json(),
                                "receiptDigest": "0x" + signed.digest.hex(),
                                "signature": "0x" + signed.signature.hex()}))


def decode_signed_receipt(data: bytes) -> SignedReceipt:
    try:
        obj = json.loads(data)
    except (ValueError, UnicodeDecodeError) as e:
        raise ManifestError(f"signed receipt is not UTF-8 JSON: {e}") from e
    if not isinstance(obj, dict) or set(obj) != {"receipt", "receiptDigest", "signature"}:
        raise ManifestError("a signed receipt must be an object with exactly receipt, "
                            f"receiptDigest, signature; got {str(obj)[:200]}")
    return _signed_from_json(obj, "signed receipt")


# ---- helpers ---------------------------------------------------------------------------------
def _parse_entry(i: int, e: object) -> ManifestEntry:
    where = f"entries[{i}]"
    if not isinstance(e, dict) or set(e) != {"ciphertext", "receipt", "receiptDigest",
                                             "signature"}:
        raise ManifestError(f"{where} must have exactly ciphertext, receipt, receiptDigest, "
                            f"signature; got {str(e)[:200]}", param="entries")
    try:
        pointer = Pointer.parse(e["ciphertext"])
    except MalformedPointerError as err:
        raise ManifestError(f"{where}.ciphertext: {err.message}", param="entries") from err
    return ManifestEntry(_signed_from_json(e, where), pointer)


def _signed_from_json(obj: Mapping[str, Any], where: str) -> SignedReceipt:
    try:
        receipt = Receipt.from_json(obj["receipt"])
    except ReceiptFormatError as err:
        raise ManifestError(f"{where}.receipt: {err.message}") from err
    digest = _parse_hex(obj["receiptDigest"], 32, f"{where}.receiptDigest")
    sig = _parse_hex(obj["signature"], SIGNATURE_LEN, f"{where}.signature")
    return SignedReceipt(receipt, digest, sig)


def _parse_hex(value: object, length: int, field: str) -> bytes:
    if (not isinstance(value, str) or not value.startswith("0x")
            or len(value) != 2 + 2 * length or value != value.lower()):
        raise ManifestError(f"{field} must be 0x + {2 * length} lower-case hex digits, "
                            f"got {str(value)[:100]!r}", param=field)
    try:
        return bytes.fromhex(value[2:])
    except ValueError:
        raise ManifestError(f"{field} is not hex: {value[:100]!r}", param=field) from None


def _parse_hex32(value: object, field: str) -> bytes:
    return _parse_hex(value, 32, field)


def _check_len(value: object, length: int, field: str) -> None:
    if not isinstance(value, bytes) or len(value) != length:
        raise ManifestError(f"{field} must be {length} bytes, got {value!r}", param=field)


def _check_unique(digests: Sequence[bytes]) -> None:
    seen: set[bytes] = set()
    for d in digests:
        if d in seen:
            raise ManifestError(f"receipt 0x{d.hex()} appears twice in one batch")
        seen.add(d)
