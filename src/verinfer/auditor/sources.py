"""Where a receipt and its ciphertext come from: the REF the auditor passes (a receipt id, a DA
pointer, or a JSON file — an API response, its ``verification`` object, a signed receipt), the
operator's ``/v1/receipts/{id}``, the chain's committed batches and the DA layer.

Everything read here is the operator's (or a stranger's) data: files and HTTP answers go
through the bounded JSON parser, blobs are size-capped before they are hashed, and nothing is
believed that the signature, the Merkle root on chain or a hash does not vouch for.
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from verinfer.da_client.base import DEFAULT_MAX_BLOB_BYTES
from verinfer.da_client.errors import BlobNotFoundError
from verinfer.da_client.pointer import Pointer
from verinfer.errors import VerinferError
from verinfer.protocol.hexutil import parse_hex, to_hex
from verinfer.protocol.jsonsafe import loads_untrusted
from verinfer.receipts.eip712 import Domain
from verinfer.receipts.signed import SignedReceipt
from verinfer.verifier.challenger import (
    MAX_REF_BYTES,
    TYPED_DATA_KEYS,
    read_ref_file,
    signed_from_json,
)
from verinfer.verifier.enclave_judge import BlobSource
from verinfer.verifier.errors import ReceiptRefError

#: No honest envelope is larger than what a DA backend accepts.
MAX_BLOB_BYTES = DEFAULT_MAX_BLOB_BYTES
#: Wall time for the operator's answer. httpx's timeout is per read: an operator dripping its
#: answer a byte at a time held ``verinfer reproduce`` (a watcher about to challenge) forever.
OPERATOR_DEADLINE_S = 60.0


@dataclass(frozen=True)
class Resolved:
    signed: SignedReceipt
    da_pointer: str | None  # named by the REF or the operator (checked by hash, never trusted)
    source: str  # how the receipt was obtained, for the report


def resolve_ref(ref: str, *, domain: Domain | None, operator_url: str | None) -> Resolved:
    """The signed receipt REF names. ``domain``: the chain's (None: no chain; the receipt's
    own domain is taken as it stands). A bare receipt id needs ``operator_url`` (or, with a
    chain, the batch lookup the caller does through ``locate``)."""
    if ref.startswith("da://"):
        Pointer.parse(ref)  # typed error for a malformed one
        raise ReceiptRefError("a DA pointer names a ciphertext, not a receipt: look it up in "
                              "the chain's batches (needs --rpc-url and --deployment)",
                              param="ref")
    if ref.startswith("0x") and len(ref) == 66:
        digest = parse_hex(ref.lower(), 32, "ref")
        if operator_url is None:
            raise ReceiptRefError("a receipt id is looked up at the operator (--operator-url) "
                                  "or in the chain's batches (--rpc-url, --deployment)",
                                  param="ref")
        doc = _operator_receipt(operator_url, ref.lower())
        resolved = _from_doc(doc, domain, f"operator {operator_url}")
        if resolved.signed.digest != digest:
            raise ReceiptRefError(f"the operator answered receipt {to_hex(resolved.signed.digest)}"
                                  f" for {ref}", param="ref")
        return resolved
    path = Path(ref)
    if not path.is_file():
        raise ReceiptRefError(f"{ref[:200]!r} is neither a receipt id, a DA pointer nor a file",
                              param="ref")
    return _from_doc(read_ref_file(ref), domain, f"file {ref}")


def _from_doc(doc: Any, domain: Domain | None, source: str) -> Resolved:
    """A verification object, API response, /v1/receipts answer or signed receipt JSON."""
    v = doc.get("verification") if isinstance(doc, dict) else None
    inner = v if isinstance(v, dict) else doc
    if domain is None:
        domain = _own_domain(inner)
    try:
        signed = signed_from_json(doc, domain)
    except ReceiptRefError:
        raise
    except VerinferError as e:
        raise ReceiptRefError(f"{source}: not a signed receipt: {e.message}",
                              param="ref") from None
    pointer = inner.get("da_pointer") if isinstance(inner, dict) else None
    return Resolved(signed, pointer if isinstance(pointer, str) else None, source)


def _own_domain(d: Any) -> Domain:
    """The domain a receipt JSON names itself (typed data, or a signed receipt's ``domain``):
    without a chain there is nothing else to hold it to."""
    if isinstance(d, dict):
        r = d.get("receipt")
        if isinstance(r, dict) and set(r) == TYPED_DATA_KEYS:
            return Domain.from_json(r["domain"])
        if "domain" in d:
            return Domain.from_json(d["domain"])
    raise ReceiptRefError("without a chain (--rpc-url, --deployment) the receipt must name its "
                          "own EIP-712 domain (typed data or a signed receipt JSON)",
                          param="ref")


def _operator_receipt(base: str, receipt_id: str) -> Any:
    url = f"{base.rstrip('/')}/v1/receipts/{receipt_id}"
    started = time.monotonic()
    try:
        with httpx.stream("GET", url, timeout=30) as r:
            body = bytearray()
            for chunk in r.iter_bytes():
                body += chunk
                if len(body) > MAX_REF_BYTES:
                    raise ReceiptRefError(f"{url}: answer larger than {MAX_REF_BYTES} bytes",
                                          param="operator_url")
                if time.monotonic() - started > OPERATOR_DEADLINE_S:
                    raise ReceiptRefError(f"{url}: no whole answer within "
                                          f"{OPERATOR_DEADLINE_S} s", param="operator_url")
    except httpx.HTTPError as e:
        raise ReceiptRefError(f"{url}: {type(e).__name__}: {e}"[:300],
                              param="operator_url") from None
    if r.status_code != 200:
        raise ReceiptRefError(f"{url}: HTTP {r.status_code}: {bytes(body[:200])!r}",
                              param="operator_url")
    return loads_untrusted(body, max_bytes=MAX_REF_BYTES, what=url)


@dataclass(frozen=True)
class Fetched:
    blob: bytes | None  # the ciphertext whose sha256 is the receipt's ciphertextHash
    pointer: str | None  # where it came from
    wrong: tuple[str, ...]  # pointers that answered other bytes than the receipt commits to
    tried: tuple[str, ...]  # what was tried and why it gave nothing


def fetch_ciphertext(da: BlobSource, ciphertext_hash: bytes, pointers: list[str],
                     backends: list[str]) -> Fetched:
    """The receipt's ciphertext. Tries the pointers named by the batch manifest, the operator
    or the REF, then the content address ``da://<backend>/0x<ciphertextHash>`` on each
    content-addressed backend the auditor reads (local, redis: there the receipt's own hash
    names its ciphertext). A blob of another hash, or over the cap, is not it: noted in
    ``wrong``/``tried``, the search goes on."""
    tried: list[str] = []
    wrong: list[str] = []
    candidates = list(dict.fromkeys(
        [*pointers, *(str(Pointer(b, ciphertext_hash)) for b in backends
                      if b in ("local", "redis"))]))
    for text in candidates:
        try:
            blob = da.get(Pointer.parse(text))
        except BlobNotFoundError:
            tried.append(f"{text[:90]}: not found")
            continue
        except VerinferError as e:
            tried.append(f"{text[:90]}: {e.message[:160]}")
            continue
        if len(blob) > MAX_BLOB_BYTES:
            tried.append(f"{text[:90]}: {len(blob)} bytes, over the {MAX_BLOB_BYTES} cap")
            continue
        if hashlib.sha256(blob).digest() != ciphertext_hash:
            tried.append(f"{text[:90]}: its bytes do not hash to the receipt's ciphertextHash")
            wrong.append(text)
            continue
        return Fetched(blob, text, tuple(wrong), tuple(tried))
    if not candidates:
        tried.append("no DA pointer known and no content-addressed DA backend configured")
    return Fetched(None, None, tuple(wrong), tuple(tried))
