"""A receipt together with its domain and signature: the unit that travels in API responses,
batch manifests and challenges, and its wire form (``to_bytes``/``from_bytes``: the bytes the
operator's outbox stores for every receipt)."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import rfc8785

from verinfer.protocol.errors import ReceiptFormatError
from verinfer.protocol.fields import parse_hex
from verinfer.protocol.hexutil import to_hex
from verinfer.protocol.jsonsafe import UntrustedJsonError, loads_untrusted
from verinfer.receipts.eip712 import (
    Domain,
    Receipt,
    ReceiptSigner,
    check_receipt_domain,
    verify_receipt,
)

#: The wire form is ~1 KB; anything far larger is not a signed receipt.
MAX_WIRE_BYTES = 1 << 16
#: {"receipt": {...}, "domain": {...}, ...} nests 2 deep; deeper is hostile.
MAX_WIRE_DEPTH = 8
WIRE_KEYS = frozenset({"digest", "domain", "receipt", "signature"})


@dataclass(frozen=True)
class SignedReceipt:
    receipt: Receipt
    domain: Domain
    signature: bytes  # 65 bytes r||s||v

    @classmethod
    def sign(cls, receipt: Receipt, domain: Domain, signer: ReceiptSigner) -> SignedReceipt:
        return cls(receipt, domain, signer.sign(receipt, domain))

    @functools.cached_property
    def digest(self) -> bytes:
        """The receipt id (EIP-712 signing digest); what Merkle batches commit to. Computed
        once per instance (the outbox and the manifest builder each ask for it)."""
        return self.receipt.digest(self.domain)

    def verify(self, expected_operator: str | None = None, *,
               chain_id: int | None = None) -> str:
        """Raises :class:`SignatureError` unless signed by the receipt's operator for the
        domain's chain (``WrongChainError``: receipt chainId != domain chainId, or != the
        ``chain_id`` being read)."""
        return verify_receipt(self.receipt, self.domain, self.signature, expected_operator,
                              chain_id=chain_id)

    def to_json(self) -> dict[str, Any]:
        return {"receipt": self.receipt.to_json(), "domain": self.domain.to_json(),
                "signature": to_hex(self.signature), "digest": to_hex(self.digest)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> SignedReceipt:
        """Strict parse. ``digest``, if present, must equal the recomputed one."""
        if not isinstance(data, Mapping) or not {"receipt", "domain", "signature"} <= set(data) \
                or not set(data) <= {"receipt", "domain", "signature", "digest"}:
            raise ReceiptFormatError("a signed receipt is an object with receipt, domain, "
                                     f"signature (and optional digest), got {data!r}")
        domain = Domain.from_json(data["domain"])
        out = cls(Receipt.from_json(data["receipt"]), domain,
                  parse_hex(data["signature"], 65, "signature"))
        if "digest" in data and parse_hex(data["digest"], 32, "digest") != out.digest:
            raise ReceiptFormatError(f"digest {data['digest']!r} does not match the receipt "
                                     f"({to_hex(out.digest)})", param="digest")
        return out

    def to_bytes(self) -> bytes:
        """The wire form: RFC 8785 canonical JSON of :meth:`to_json`, ``{"digest": "0x..",
        "domain": {...}, "receipt": {...}, "signature": "0x.."}``."""
        return bytes(rfc8785.dumps(self.to_json()))

    @classmethod
    def from_bytes(cls, data: bytes) -> SignedReceipt:
        """Inverse of :meth:`to_bytes`, strict: a bounded parse, exactly the four keys, the
        digest recomputed, and the receipt's chain the domain's (``WrongChainError``: such a
        receipt could never be disputed). Other failures are :class:`ReceiptFormatError`."""
        try:
            obj = loads_untrusted(data, max_bytes=MAX_WIRE_BYTES, depth=MAX_WIRE_DEPTH,
                                  what="signed receipt")
        except UntrustedJsonError as e:
            raise ReceiptFormatError(e.message) from e
        if not isinstance(obj, dict) or set(obj) != WIRE_KEYS:
            raise ReceiptFormatError("a signed receipt must be an object with exactly digest, "
                                     f"domain, receipt, signature; got {str(obj)[:200]}")
        signed = cls.from_json(obj)
        check_receipt_domain(signed.receipt, signed.domain)
        return signed
