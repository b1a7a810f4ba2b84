"""Batch manifests: the receipts of one Merkle batch, published as one canonical-JSON blob.

Format (RFC 8785 canonical JSON, UTF-8; keys sorted by the canonicalization)::

    {"batchRoot": "0x<32 bytes>", "domain": {<EIP-712 domain>}, "entries": [<entry>, ...],
     "format": "verinfer.batch-manifest/2", "leafCount": <n>}
    entry = {"ciphertext": "da://<backend>/0x<hex>", "receipt": {<Receipt typed fields>},
             "receiptDigest": "0x<32 bytes>", "signature": "0x<65 bytes>"}

Entries are in leaf order; each is a :class:`verinfer.receipts.signed.SignedReceipt` under the
manifest's one ``domain`` (its ``receiptDigest`` must be the receipt's EIP-712 digest under that
domain); ``batchRoot`` is the root of ``verinfer.receipts.merkle`` over those digests; each
receipt's ``ciphertextHash`` equals the sha256 its pointer names. Parsing rejects anything else,
including a non-canonical spelling of the same content, so a manifest's bytes (and hence its DA
pointer) are a function of its content.

Format 2 is format 1 plus the ``domain`` key; format 1 never shipped and is not read (a format
change bumps the format string, it does not grow a second parser).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import rfc8785

from verinfer.da_client.base import DEFAULT_MAX_BLOB_BYTES
from verinfer.da_client.errors import MalformedPointerError, ManifestError
from verinfer.da_client.pointer import MAX_COMMITMENT_BYTES, Pointer
from verinfer.protocol.errors import ReceiptFormatError
from verinfer.protocol.hexutil import HexFormatError, parse_hex, to_hex
from verinfer.protocol.jsonsafe import UntrustedJsonError, loads_untrusted
from verinfer.receipts.eip712 import Domain, Receipt, check_receipt_domain
from verinfer.receipts.errors import MerkleError, SignatureError, WrongChainError
from verinfer.receipts.merkle import MerkleProof, build_tree
from verinfer.receipts.signed import SignedReceipt

MANIFEST_FORMAT = "verinfer.batch-manifest/2"
SIGNATURE_LEN = 65
_KEYS = frozenset({"batchRoot", "domain", "entries", "format", "leafCount"})
#: A manifest is nested 4 deep (object > entries > entry > receipt); anything deeper is hostile.
MANIFEST_MAX_DEPTH = 8
#: Canonical bytes of one entry at most: the pointer (an eigenda one carries up to
#: MAX_COMMITMENT_BYTES as hex) plus < 1 KB of receipt, digest, signature and keys
#: (tests/unit/test_manifest_bound.py builds the largest entry the format admits).
MAX_ENTRY_BYTES = 2 * MAX_COMMITMENT_BYTES + 2048
#: The manifest's own keys, domain and punctuation around the entries.
MANIFEST_OVERHEAD_BYTES = 1024


def max_manifest_bytes(leaf_count: int) -> int:
    """The largest manifest of a batch of ``leaf_count`` receipts (the batch's on-chain
    leafCount): bytes past it are not that batch's manifest, refused before any parsing."""
    return MANIFEST_OVERHEAD_BYTES + max(leaf_count, 0) * MAX_ENTRY_BYTES


@dataclass(frozen=True)
class ManifestEntry:
    signed: SignedReceipt
    ciphertext: Pointer

    def __post_init__(self) -> None:
        _check_len(self.signed.signature, SIGNATURE_LEN, "signature")
        want = self.signed.receipt.ciphertext_hash
        if self.ciphertext.blob_sha256 != want:
            raise ManifestError(
                f"receipt 0x{self.signed.digest.hex()} has ciphertextHash 0x{want.hex()} but "
                f"its pointer names sha256 0x{self.ciphertext.blob_sha256.hex()}",
                param="ciphertext")

    def to_json(self) -> dict[str, Any]:
        return {"ciphertext": str(self.ciphertext), "receipt": self.signed.receipt.to_json(),
                "receiptDigest": to_hex(self.signed.digest),
                "signature": to_hex(self.signed.signature)}


@dataclass(frozen=True)
class BatchManifest:
    root: bytes
    entries: tuple[ManifestEntry, ...]

    @property
    def leaf_count(self) -> int:
        return len(self.entries)

    @property
    def domain(self) -> Domain:
        """The EIP-712 domain every receipt of the batch is signed under."""
        return self.entries[0].signed.domain

    @property
    def digests(self) -> tuple[bytes, ...]:
        return tuple(e.signed.digest for e in self.entries)

    def to_json(self) -> dict[str, Any]:
        return {"batchRoot": to_hex(self.root), "domain": self.domain.to_json(),
                "entries": [e.to_json() for e in self.entries],
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
        """Check every receipt is for ``domain``'s chain, every digest is the receipt's EIP-712
        digest under ``domain`` and every signature recovers to the receipt's operator; raise
        ManifestError naming the first bad entry."""
        for i, e in enumerate(self.entries):
            r = e.signed.receipt
            if r.digest(domain) != e.signed.digest:
                raise ManifestError(f"entry {i}: receiptDigest 0x{e.signed.digest.hex()} is not "
                                    f"the EIP-712 digest of its receipt under {domain}")
            try:
                e.signed.verify(chain_id=domain.chain_id)
            except SignatureError as err:
                raise ManifestError(f"entry {i}: {err.message}") from err


def build_manifest(entries: Sequence[ManifestEntry]) -> BatchManifest:
    """The manifest of ``entries`` (in leaf order), all signed under one EIP-712 domain."""
    if not entries:
        raise ManifestError("an empty batch has no manifest")
    domain = entries[0].signed.domain
    for i, e in enumerate(entries):
        if e.signed.domain != domain:
            raise ManifestError(f"entry {i} is signed under {e.signed.domain.to_json()}, entry 0 "
                                f"under {domain.to_json()}: a batch has one EIP-712 domain",
                                param="domain")
    digests = [e.signed.digest for e in entries]
    _check_unique(digests)
    return BatchManifest(build_tree(digests).root, tuple(entries))


def parse_manifest(data: bytes, domain: Domain | None = None) -> BatchManifest:
    """Parse and fully validate manifest bytes (canonical form, domain, digests, root,
    pointers, receipts; not the signatures: :meth:`BatchManifest.verify_signatures`).

    ``domain``: the EIP-712 domain the reader expects (optional); a manifest naming another
    one is rejected."""
    # The bytes come from DA, i.e. from whoever published them (possibly a dishonest
    # operator): bounded parse, so a nesting bomb is a ManifestError, not a dead process.
    try:
        obj = loads_untrusted(data, max_bytes=DEFAULT_MAX_BLOB_BYTES, depth=MANIFEST_MAX_DEPTH,
                              what="batch manifest")
    except UntrustedJsonError as e:
        raise ManifestError(e.message) from e
    if not isinstance(obj, dict):
        raise ManifestError(f"manifest must be a JSON object, got {type(obj).__name__}")
    # The format first: an object of another format gets that answer, not a list of keys.
    if obj.get("format") != MANIFEST_FORMAT:
        raise ManifestError(f"unknown manifest format {str(obj.get('format'))[:100]!r} "
                            f"(this reader reads {MANIFEST_FORMAT!r})", param="format")
    if set(obj) != _KEYS:
        raise ManifestError(f"manifest keys must be {sorted(_KEYS)}, got {sorted(obj)[:10]}")
    try:
        own = Domain.from_json(obj["domain"])
    except ReceiptFormatError as e:
        raise ManifestError(f"domain: {e.message}", param="domain") from e
    if domain is not None and own != domain:
        raise ManifestError(f"the manifest's receipts are signed under {own.to_json()}, "
                            f"not the expected {domain.to_json()}", param="domain")
    domain = own
    raw_entries = obj["entries"]
    if not isinstance(raw_entries, list) or not raw_entries:
        raise ManifestError("manifest entries must be a non-empty list", param="entries")
    count = obj["leafCount"]
    if isinstance(count, bool) or not isinstance(count, int) or count != len(raw_entries):
        raise ManifestError(f"leafCount {count!r} does not match {len(raw_entries)} entries",
                            param="leafCount")
    entries = tuple(_parse_entry(i, e, domain) for i, e in enumerate(raw_entries))
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


def inclusion_proof(manifest: bytes | BatchManifest, receipt_digest: bytes,
                    domain: Domain | None = None) -> MerkleProof:
    """One receipt's Merkle inclusion proof, from a manifest (bytes are parsed and checked,
    with ``domain`` as in :func:`parse_manifest`)."""
    m = parse_manifest(manifest, domain) if isinstance(manifest, bytes | bytearray) \
        else manifest
    return m.proof(receipt_digest)


# ---- helpers ---------------------------------------------------------------------------------
def _parse_entry(i: int, e: object, domain: Domain) -> ManifestEntry:
    where = f"entries[{i}]"
    if not isinstance(e, dict) or set(e) != {"ciphertext", "receipt", "receiptDigest",
                                             "signature"}:
        raise ManifestError(f"{where} must have exactly ciphertext, receipt, receiptDigest, "
                            f"signature; got {str(e)[:200]}", param="entries")
    try:
        pointer = Pointer.parse(e["ciphertext"])
    except MalformedPointerError as err:
        raise ManifestError(f"{where}.ciphertext: {err.message}", param="entries") from err
    return ManifestEntry(_signed_from_json(e, where, domain), pointer)


def _signed_from_json(obj: Mapping[str, Any], where: str, domain: Domain) -> SignedReceipt:
    """``{"receipt", "receiptDigest", "signature"}`` under ``domain``; the digest must be the
    receipt's EIP-712 digest under it."""
    try:
        receipt = Receipt.from_json(obj["receipt"])
    except ReceiptFormatError as err:
        raise ManifestError(f"{where}.receipt: {err.message}") from err
    digest = _parse_hex(obj["receiptDigest"], 32, f"{where}.receiptDigest")
    sig = _parse_hex(obj["signature"], SIGNATURE_LEN, f"{where}.signature")
    try:  # a receipt for another chain can never be disputed: not part of any valid batch
        check_receipt_domain(receipt, domain)
    except WrongChainError as err:
        raise ManifestError(f"{where}.receipt: {err.message}", param=f"{where}.receipt") from err
    signed = SignedReceipt(receipt, domain, sig)
    if signed.digest != digest:
        raise ManifestError(f"{where}.receiptDigest 0x{digest.hex()} does not match the EIP-712 "
                            f"digest of its receipt under {domain.to_json()} "
                            f"(0x{signed.digest.hex()})", param=f"{where}.receiptDigest")
    return signed


def _parse_hex(value: object, length: int, field: str) -> bytes:
    # lower-case only: a manifest has one spelling (its bytes are its DA pointer)
    try:
        return parse_hex(value, length, field, lower_only=True)
    except HexFormatError:
        raise ManifestError(f"{field} must be 0x + {2 * length} lower-case hex digits, "
                            f"got {str(value)[:100]!r}", param=field) from None


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
