"""Wire format of the KMS shard API, shared byte for byte by shards and enclaves.

report_data (64 bytes, what the enclave's quote must carry) =
  sha512(b"verinfer/kms/report-data/v1" || u64 epoch || lp(purpose) || lp(challenge_id)
         || lp(requester, lower-case 0x-hex) || lp(enclave public key)
         || u16 count || for each shard index ascending: u16 index || lp(nonce))
lp(x) = u32 big-endian length || x (strings UTF-8).

The requester (the verifier's Ethereum account) signs EIP-191 ``personal_sign`` over the 32
bytes sha256(b"verinfer/kms/requester/v1" || report_data). A shard signs each release the same
way with its identity key over sha256(RFC 8785 JSON of the release without "signature").
The share travels as HPKE (X25519, HKDF-SHA256, AES-256-GCM) single-shot ciphertext enc || ct
to the enclave's ephemeral X25519 key, info = share_info(...), plaintext = 32-byte f(i).

Per-receipt decryption (threshold P-256 epochs, ``POST /v1/decrypt``): the request also
carries a ``target`` (the receipt and the envelope blob). report_data then uses the label
``verinfer/kms/report-data/v2`` and appends lp(receipt struct hash, EIP-712 hashStruct, no
domain) || lp(ciphertext hash), so the quote and the requester's signature bind the one receipt. The
answer has the same shape as a release; its ``encrypted_share`` is HPKE (as above, info =
partial_info(...)) of D_i (33-byte compressed) || DLEQ proof c || z (verinfer.kms.tdh), the
proof's context being report_data || u16 shard index.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

import rfc8785
from cryptography.hazmat.primitives import hpke

from verinfer.attestation.quotes import Quote
from verinfer.da_client.base import DEFAULT_MAX_BLOB_BYTES
from verinfer.errors import VerinferError
from verinfer.kms.errors import BadReleaseRequest
from verinfer.protocol.hexutil import HexFormatError, parse_hex, to_hex
from verinfer.receipts.eip712 import Receipt

Purpose = Literal["full_challenge", "light_audit"]
PURPOSES: tuple[str, ...] = ("full_challenge", "light_audit")
NONCE_LEN = 32
ENCLAVE_KEY_LEN = 32  # raw X25519 public key
TRANSPORT_SUITE = hpke.Suite(hpke.KEM.X25519, hpke.KDF.HKDF_SHA256, hpke.AEAD.AES_256_GCM)


def _lp(b: bytes) -> bytes:
    return len(b).to_bytes(4, "big") + b


def report_data(*, epoch: int, purpose: str, challenge_id: str, requester: str,
                enclave_public_key: bytes, nonces: Mapping[int, bytes],
                target: DecryptTarget | None = None) -> bytes:
    label = b"verinfer/kms/report-data/v1" if target is None else b"verinfer/kms/report-data/v2"
    parts = [label, epoch.to_bytes(8, "big"), _lp(purpose.encode()),
             _lp(challenge_id.encode()), _lp(requester.lower().encode()),
             _lp(enclave_public_key), len(nonces).to_bytes(2, "big")]
    for idx in sorted(nonces):
        parts.append(idx.to_bytes(2, "big") + _lp(nonces[idx]))
    if target is not None:
        parts += [_lp(target.receipt_hash), _lp(target.ciphertext_hash)]
    return hashlib.sha512(b"".join(parts)).digest()


def partial_info(epoch: int, shard_index: int, report_data_: bytes) -> bytes:
    return (b"verinfer/kms/partial-decryption/v1" + epoch.to_bytes(8, "big")
            + shard_index.to_bytes(2, "big") + report_data_)


def dleq_context(report_data_: bytes, shard_index: int) -> bytes:
    """What a shard's DLEQ proof is bound to: this request, this shard."""
    return report_data_ + shard_index.to_bytes(2, "big")


#: An assignment naming this auditor lets any registered verifier take the audit job.
ANY_AUDITOR = "0x" + "00" * 20


@dataclass(frozen=True)
class AuditAssignment:
    """A light audit of one receipt, drawn by an audit scheduler the shards trust (their
    ``--audit-scheduler`` addresses), never chosen by the auditor. Signed EIP-191 by the
    scheduler over sha256("verinfer/kms/audit-assignment/v1" || receipt hashStruct (32) ||
    auditor (20; zero = any registered verifier) || u64 expires_at)."""

    receipt_hash: bytes
    auditor: str
    expires_at: int
    signature: bytes

    def digest(self) -> bytes:
        return hashlib.sha256(b"verinfer/kms/audit-assignment/v1" + self.receipt_hash
                              + parse_hex(self.auditor, 20, "auditor")
                              + self.expires_at.to_bytes(8, "big")).digest()

    def to_json(self) -> dict[str, Any]:
        return {"receipt_hash": to_hex(self.receipt_hash), "auditor": self.auditor,
                "expires_at": self.expires_at, "signature": to_hex(self.signature)}

    @classmethod
    def from_json(cls, d: Any) -> AuditAssignment:
        if not isinstance(d, Mapping) or set(d) != {"receipt_hash", "auditor", "expires_at",
                                                    "signature"}:
            raise BadReleaseRequest("assignment must be {receipt_hash, auditor, expires_at, "
                                    "signature}", param="assignment")
        exp = d["expires_at"]
        if not isinstance(exp, int) or isinstance(exp, bool) or not 0 <= exp < 2**64:
            raise BadReleaseRequest("assignment.expires_at must be a u64", param="assignment")
        unhex(d["auditor"], "assignment.auditor", 20)
        return cls(unhex(d["receipt_hash"], "assignment.receipt_hash", 32),
                   str(d["auditor"]).lower(), exp,
                   unhex(d["signature"], "assignment.signature", 65))


@dataclass(frozen=True)
class DecryptTarget:
    """The one envelope a per-receipt request is about. The shard recomputes everything:
    the receipt's EIP-712 digest under the shard's *own* domain (its deployment: what
    ChallengeManager stores as a challenge's receiptDigest), sha256(ciphertext) must be the
    receipt's ciphertextHash, and E is read out of the ciphertext itself, never taken from
    the requester."""

    receipt: Receipt
    ciphertext: bytes

    @property
    def receipt_hash(self) -> bytes:
        """EIP-712 hashStruct of the receipt: its id independent of the domain."""
        return self.receipt.struct_hash

    @property
    def ciphertext_hash(self) -> bytes:
        return hashlib.sha256(self.ciphertext).digest()

    def to_json(self) -> dict[str, Any]:
        return {"receipt": self.receipt.to_json(), "ciphertext": b64(self.ciphertext)}

    @classmethod
    def from_json(cls, d: Any) -> DecryptTarget:
        if not isinstance(d, Mapping) or set(d) != {"receipt", "ciphertext"}:
            raise BadReleaseRequest("target must be {receipt, ciphertext}", param="target")
        try:
            receipt = Receipt.from_json(d["receipt"])
        except VerinferError as e:
            raise BadReleaseRequest(f"target: {e.message}", param="target") from e
        ct = unb64(d["ciphertext"], "target.ciphertext")
        out = cls(receipt, ct)
        if out.ciphertext_hash != receipt.ciphertext_hash:
            raise BadReleaseRequest("target ciphertext does not hash to the receipt's "
                                    "ciphertextHash", param="target")
        return out


#: Shape of a release or decryption request, counted on the raw bytes before any parser runs
#: (``jsonsafe.check_shape``): keys and strings (10 top-level fields, 255 nonces with their
#: keys, the quote's 2, the target's receipt of 10 fields, the assignment's 4: ~600 at most),
#: objects (the body, nonces, quote, target, receipt, assignment: 6) and values. 16 MiB of
#: ``[[],[],…]`` — 5.6 M lists, 6.9 s of parsing and 938 MB of RSS on the shard — is refused at
#: its count, before anything is built.
MAX_REQUEST_STRINGS = 1024
MAX_REQUEST_CONTAINERS = 16
MAX_REQUEST_VALUES = 1024
#: Largest envelope a per-receipt request can carry: nothing larger is on DA (the receipt's
#: ciphertext is published there, ``da_client.base.DEFAULT_MAX_BLOB_BYTES``; no protocol
#: bound is tighter: a response with logprobs is bounded only by it).
MAX_ENVELOPE_BYTES = DEFAULT_MAX_BLOB_BYTES


def max_decrypt_body_bytes(release_body_bytes: int) -> int:
    """The largest ``/v1/decrypt`` body an honest requester sends: a release request
    (``release_body_bytes``: quote, nonces, signatures) plus the receipt (< 2 KB) plus the
    largest envelope in base64."""
    return release_body_bytes + 2048 + 4 * -(-MAX_ENVELOPE_BYTES // 3)


#: The admission headers of a large ``/v1/decrypt`` body: who asks, and their signature over
#: the request's report_data (the same signature the body carries). A shard checks them —
#: one signature recovery and "is a registered verifier" — before reading more than a
#: release request's worth of bytes, so a stranger cannot make it read megabytes.
HEADER_REQUESTER = "x-verinfer-requester"
HEADER_REPORT_DATA = "x-verinfer-report-data"
HEADER_SIGNATURE = "x-verinfer-requester-signature"


def admission_headers(req: ReleaseRequest) -> dict[str, str]:
    return {HEADER_REQUESTER: req.requester, HEADER_REPORT_DATA: to_hex(req.report_data()),
            HEADER_SIGNATURE: to_hex(req.requester_signature)}


def parse_admission_headers(headers: Mapping[str, str]) -> tuple[str, bytes, bytes]:
    """(requester, report_data, signature) of the admission headers; BadReleaseRequest when
    one is missing or malformed."""
    missing = [h for h in (HEADER_REQUESTER, HEADER_REPORT_DATA, HEADER_SIGNATURE)
               if h not in headers]
    if missing:
        raise BadReleaseRequest(f"a body this large needs the admission headers {missing}",
                                param="headers")
    unhex(headers[HEADER_REQUESTER], HEADER_REQUESTER, 20)
    return (headers[HEADER_REQUESTER].lower(),
            unhex(headers[HEADER_REPORT_DATA], HEADER_REPORT_DATA, 64),
            unhex(headers[HEADER_SIGNATURE], HEADER_SIGNATURE, 65))


def requester_digest(report_data_: bytes) -> bytes:
    return hashlib.sha256(b"verinfer/kms/requester/v1" + report_data_).digest()


def share_info(epoch: int, shard_index: int, report_data_: bytes) -> bytes:
    return (b"verinfer/kms/share-transport/v1" + epoch.to_bytes(8, "big")
            + shard_index.to_bytes(2, "big") + report_data_)


def release_digest(unsigned: Mapping[str, Any]) -> bytes:
    return hashlib.sha256(b"verinfer/kms/release/v1" + rfc8785.dumps(dict(unsigned))).digest()


def b64(b: bytes) -> str:
    return base64.b64encode(b).decode()


def unb64(s: Any, what: str) -> bytes:
    if not isinstance(s, str):
        raise BadReleaseRequest(f"{what} must be base64 text, got {s!r:.80}", param=what)
    try:
        return base64.b64decode(s, validate=True)
    except (binascii.Error, ValueError) as e:
        raise BadReleaseRequest(f"{what} is not base64", param=what) from e


def unhex(s: Any, what: str, length: int | None = None) -> bytes:
    """A request field: ``0x`` hex (the one parser, strict: every writer of this format
    prefixes), refused as a :class:`BadReleaseRequest` naming the field."""
    try:
        return parse_hex(s, length, what)
    except HexFormatError as e:
        raise BadReleaseRequest(e.message, param=what) from None


@dataclass(frozen=True)
class ReleaseRequest:
    epoch: int
    purpose: str
    challenge_id: str
    requester: str
    requester_signature: bytes
    enclave_public_key: bytes
    nonces: dict[int, bytes]
    quote: Quote
    target: DecryptTarget | None = None
    #: light audits of per-receipt epochs: the scheduler's assignment (authorization
    #: evidence checked by the shard, not part of report_data)
    assignment: AuditAssignment | None = None

    def report_data(self) -> bytes:
        return report_data(epoch=self.epoch, purpose=self.purpose, challenge_id=self.challenge_id,
                           requester=self.requester, enclave_public_key=self.enclave_public_key,
                           nonces=self.nonces, target=self.target)

    def to_json(self) -> dict[str, Any]:
        extra: dict[str, Any] = {} if self.target is None else {"target": self.target.to_json()}
        if self.assignment is not None:
            extra["assignment"] = self.assignment.to_json()
        return {**extra, "epoch": self.epoch, "purpose": self.purpose,
                "challenge_id": self.challenge_id,
                "requester": self.requester,
                "requester_signature": to_hex(self.requester_signature),
                "enclave_public_key": to_hex(self.enclave_public_key),
                "nonces": {str(k): to_hex(v) for k, v in sorted(self.nonces.items())},
                "quote": self.quote.to_wire()}

    @classmethod
    def from_json(cls, d: Any) -> ReleaseRequest:
        from verinfer.attestation.errors import AttestationError

        if not isinstance(d, Mapping):
            raise BadReleaseRequest("release request must be a JSON object")
        epoch = d.get("epoch")
        if not isinstance(epoch, int) or isinstance(epoch, bool) or epoch < 0:
            raise BadReleaseRequest(f"epoch must be a non-negative int, got {epoch!r:.40}",
                                    param="epoch")
        purpose = d.get("purpose")
        if purpose not in PURPOSES:
            raise BadReleaseRequest(f"purpose must be one of {list(PURPOSES)}, got {purpose!r:.40}",
                                    param="purpose")
        challenge_id, requester = d.get("challenge_id"), d.get("requester")
        if not isinstance(challenge_id, str) or not 0 < len(challenge_id) <= 200:
            raise BadReleaseRequest(f"challenge_id must be a non-empty string, got "
                                    f"{challenge_id!r:.80}", param="challenge_id")
        unhex(requester, "requester", 20)
        raw_nonces = d.get("nonces")
        if not isinstance(raw_nonces, Mapping) or not 0 < len(raw_nonces) <= 255:
            raise BadReleaseRequest("nonces must be a non-empty {shard_index: hex} object",
                                    param="nonces")
        nonces: dict[int, bytes] = {}
        for k, v in raw_nonces.items():
            if not isinstance(k, str) or not k.isdigit() or not 1 <= int(k) <= 255:
                raise BadReleaseRequest(f"nonce key {k!r:.20} is not a shard index",
                                        param="nonces")
            nonces[int(k)] = unhex(v, f"nonces.{k}", NONCE_LEN)
        try:
            quote = Quote.from_wire(d.get("quote"))
        except AttestationError as e:
            raise BadReleaseRequest(e.message, param="quote") from e
        target = None if d.get("target") is None else DecryptTarget.from_json(d.get("target"))
        assignment = (None if d.get("assignment") is None
                      else AuditAssignment.from_json(d.get("assignment")))
        return cls(epoch=epoch, purpose=purpose, challenge_id=challenge_id, target=target,
                   assignment=assignment,
                   requester=str(requester).lower(),
                   requester_signature=unhex(d.get("requester_signature"),
                                             "requester_signature", 65),
                   enclave_public_key=unhex(d.get("enclave_public_key"), "enclave_public_key",
                                            ENCLAVE_KEY_LEN),
                   nonces=nonces, quote=quote)


@dataclass(frozen=True)
class Release:
    """A shard's answer: its share, encrypted to the enclave and signed by the shard."""

    epoch: int
    shard_index: int
    shard_address: str
    report_data: bytes
    encrypted_share: bytes
    issued_at: int
    signature: bytes

    def unsigned_json(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "shard_index": self.shard_index,
                "shard_address": self.shard_address,
                "report_data": to_hex(self.report_data),
                "encrypted_share": b64(self.encrypted_share), "issued_at": self.issued_at}

    def to_json(self) -> dict[str, Any]:
        return {**self.unsigned_json(), "signature": to_hex(self.signature)}

    @classmethod
    def from_json(cls, d: Any) -> Release:
        if not isinstance(d, Mapping):
            raise BadReleaseRequest("release must be a JSON object")
        try:
            return cls(epoch=int(d["epoch"]), shard_index=int(d["shard_index"]),
                       shard_address=str(d["shard_address"]).lower(),
                       report_data=unhex(d["report_data"], "report_data", 64),
                       encrypted_share=unb64(d["encrypted_share"], "encrypted_share"),
                       issued_at=int(d["issued_at"]),
                       signature=unhex(d["signature"], "signature", 65))
        except (KeyError, TypeError, ValueError) as e:
            raise BadReleaseRequest(f"malformed release: {e}") from e
