"""The encrypted envelope: HPKE (RFC 9180) of the canonical (ExecRequest, ExecResult, original
OpenAI request body, original response body) to the app public key of a key epoch.

Blob (what goes to DA; ``ciphertextHash = sha256(blob)``)::

    b"VIE\\x01" || suite code (1 byte: 1 = X25519, 2 = MLKEM768_X25519, 3 = P256)
    || key_epoch (u64 BE)
    || HPKE single-shot output (enc || AEAD ciphertext)

HPKE ``info`` (``cryptography``'s single-shot API has no separate aad, so all binding goes
through info and thus into the key schedule)::

    b"verinfer/envelope/v1" || suite_id (10 bytes, RFC 9180) || version (u16) || chainId (u256)
    || operator (20) || modelId (32) || engineFingerprintHash (32) || reqHash (32)
    || outHash (32) || keyEpoch (u64)

That is every receipt field except ciphertextHash (it hashes this blob) and issuedAt (set after
sealing), so a ciphertext moved under another receipt does not open. Every failure to open
raises the same :class:`EnvelopeDecryptionError`. HPKE draws its ephemeral key from the OS
RNG inside ``cryptography``; sealing is therefore not reproducible, which is intended.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from verinfer.protocol.exec_request import CborBound
from verinfer.receipts.canonical import ExecRequest, ExecResult, decode_cbor, encode_canonical
from verinfer.receipts.eip712 import RECEIPT_VERSION, Receipt, parse_address
from verinfer.receipts.epoch_keys import (
    EnvelopeSuite,
    EpochPrivateKey,
    EpochPublicKey,
    derive_epoch_keypair,
    load_public_key,
    public_key_bytes,
)
from verinfer.receipts.errors import (
    EnvelopeContentError,
    EnvelopeDecryptionError,
    ReceiptFormatError,
    UnsupportedVersionError,
)
from verinfer.receipts.hexutil import check_bytes, check_uint, parse_hex, to_hex

__all__ = [
    "EnvelopeBinding",
    "EnvelopeContents",
    "EnvelopeSuite",
    "EpochPrivateKey",
    "EpochPublicKey",
    "derive_epoch_keypair",
    "envelope_header",
    "load_public_key",
    "open_envelope",
    "open_envelope_with",
    "public_key_bytes",
    "seal",
    "split_envelope",
]

# The plaintext map's own version (its keys), independent of the ExecRequest/ExecResult
# versions inside it. 2: the Padmé ``padding`` entry is required (version 1, without it, never
# shipped and is not read: a format change bumps this number instead of growing a second parser).
ENVELOPE_VERSION = 2
#: The plaintext map's 6 keys and 6 values (the structures sit in it as byte strings): what
#: the one CBOR decoder lets it hold, so a bomb in it is refused at its 14th item.
ENVELOPE_CBOR = CborBound(items=13, containers=1, strings=11)
LABEL = b"verinfer/envelope/v1"
MAGIC = b"VIE\x01"
SUITE_CODES = {EnvelopeSuite.X25519: 1, EnvelopeSuite.MLKEM768_X25519: 2, EnvelopeSuite.P256: 3}
_SUITE_BY_CODE = {v: k for k, v in SUITE_CODES.items()}
HEADER_LEN = len(MAGIC) + 1 + 8


@dataclass(frozen=True)
class EnvelopeBinding:
    """The receipt identity a ciphertext is bound to (the receipt minus ciphertextHash/issuedAt)."""

    operator: str
    chain_id: int
    model_id: bytes
    engine_fingerprint_hash: bytes
    req_hash: bytes
    out_hash: bytes
    key_epoch: int
    version: int = RECEIPT_VERSION

    def __post_init__(self) -> None:
        object.__setattr__(self, "operator", parse_address(self.operator, "operator"))
        check_uint(self.version, 16, "version")
        check_uint(self.chain_id, 256, "chain_id")
        for name in ("model_id", "engine_fingerprint_hash", "req_hash", "out_hash"):
            check_bytes(getattr(self, name), 32, name)
        check_uint(self.key_epoch, 64, "key_epoch")

    @classmethod
    def from_receipt(cls, r: Receipt) -> EnvelopeBinding:
        return cls(operator=r.operator, chain_id=r.chain_id, model_id=r.model_id,
                   engine_fingerprint_hash=r.engine_fingerprint_hash, req_hash=r.req_hash,
                   out_hash=r.out_hash, key_epoch=r.key_epoch, version=r.version)

    @classmethod
    def for_execution(cls, *, operator: str, chain_id: int, key_epoch: int,
                      request: ExecRequest, result: ExecResult) -> EnvelopeBinding:
        return cls(operator=operator, chain_id=chain_id, model_id=request.model_id,
                   engine_fingerprint_hash=request.engine_fingerprint_hash,
                   req_hash=request.hash, out_hash=result.hash, key_epoch=key_epoch)

    def info(self, suite: EnvelopeSuite) -> bytes:
        return b"".join((
            LABEL, suite.suite_id, self.version.to_bytes(2, "big"),
            self.chain_id.to_bytes(32, "big"), parse_hex(self.operator, 20, "operator"),
            self.model_id,
            self.engine_fingerprint_hash, self.req_hash, self.out_hash,
            self.key_epoch.to_bytes(8, "big")))


@dataclass(frozen=True)
class EnvelopeContents:
    request: ExecRequest
    result: ExecResult
    request_body: bytes  # the OpenAI request body exactly as received
    response_body: bytes  # the response body as produced, before the verification object

    def to_bytes(self) -> bytes:
        """Canonical CBOR map; the Exec* structures embedded as their canonical bytes so an
        opener hashes exactly what was hashed at sealing time. A ``padding`` entry of zero
        bytes stretches the encoding to a Padmé length (:func:`padme`), so a ciphertext on the
        DA layer tells an observer little more than the order of magnitude of the exchange."""
        fields = self._fields()
        base = len(encode_canonical({**fields, "padding": b""}))
        target = padme(base)
        while True:
            n = _padding_for(base, target)
            if n is not None:
                return encode_canonical({**fields, "padding": bytes(n)})
            target = padme(target + 1)

    def _fields(self) -> dict[str, Any]:
        for name in ("request_body", "response_body"):
            if not isinstance(getattr(self, name), bytes):
                raise ReceiptFormatError(f"{name} must be bytes", param=name)
        return {"version": ENVELOPE_VERSION, "exec_request": self.request.canonical,
                "exec_result": self.result.canonical, "request_body": self.request_body,
                "response_body": self.response_body}

    @classmethod
    def from_bytes(cls, data: bytes) -> EnvelopeContents:
        m: Any = decode_cbor(data, "envelope plaintext", ENVELOPE_CBOR)
        keys = {"version", "exec_request", "exec_result", "request_body", "response_body",
                "padding"}
        if (isinstance(m, dict) and type(m.get("version")) is int
                and m["version"] != ENVELOPE_VERSION):
            raise UnsupportedVersionError(f"unknown envelope plaintext version {m['version']!r}",
                                          param="version")
        if not isinstance(m, dict) or set(m) != keys or m["version"] != ENVELOPE_VERSION:
            raise ReceiptFormatError(f"envelope plaintext must be a version-{ENVELOPE_VERSION} map "
                                     f"with keys {sorted(keys)}")
        if not all(isinstance(m[k], bytes) for k in keys - {"version"}):
            raise ReceiptFormatError("envelope plaintext fields must be byte strings")
        out = cls(ExecRequest.from_canonical(m["exec_request"]),
                  ExecResult.from_canonical(m["exec_result"]), m["request_body"],
                  m["response_body"])
        if out.to_bytes() != data:
            raise ReceiptFormatError("envelope plaintext is not canonically encoded "
                                     "(or its padding is not the Padmé rule's zero bytes)")
        return out


def padme(length: int) -> int:
    """Padmé (Nikitin et al., PETS 2019): round ``length`` up so only its top
    ~log2(log2(length)) + 1 bits stay free; at most ~12% overhead, leaks O(log log L) bits."""
    if length < 2:
        return length
    e = length.bit_length() - 1  # floor(log2 L)
    s = e.bit_length()  # floor(log2 e) + 1
    mask = (1 << (e - s)) - 1
    return (length + mask) & ~mask


def _padding_for(base: int, target: int) -> int | None:
    """Zero bytes n such that a map whose empty ``padding`` encodes to ``base`` bytes encodes
    to exactly ``target`` with n of them (the byte string's head grows with n), or None."""
    for extra in (0, 1, 2, 4, 8):
        n = target - base - extra
        if n >= 0 and _head_extra(n) == extra:
            return n
    return None


def _head_extra(n: int) -> int:
    """Bytes a CBOR byte-string head needs for length n beyond the length-0 head."""
    return 0 if n < 24 else 1 if n < 256 else 2 if n < 65536 else 4 if n < 2**32 else 8


def _check_consistent(contents: EnvelopeContents, b: EnvelopeBinding) -> list[str]:
    req = contents.request
    problems = []
    if req.hash != b.req_hash:
        problems.append(f"req_hash {to_hex(req.hash)} != bound {to_hex(b.req_hash)}")
    if contents.result.hash != b.out_hash:
        problems.append(f"out_hash {to_hex(contents.result.hash)} != bound {to_hex(b.out_hash)}")
    if req.model_id != b.model_id:
        problems.append(f"model_id {to_hex(req.model_id)} != bound {to_hex(b.model_id)}")
    if req.engine_fingerprint_hash != b.engine_fingerprint_hash:
        problems.append("engine fingerprint hash differs from the bound one")
    return problems


def seal(contents: EnvelopeContents, binding: EnvelopeBinding,
         public_key: EpochPublicKey) -> bytes:
    """Encrypt ``contents`` to the epoch key under ``binding``; returns the DA blob."""
    problems = _check_consistent(contents, binding)
    if problems:
        raise ReceiptFormatError("envelope contents do not match the binding: "
                                 + "; ".join(problems))
    suite = public_key.suite
    return envelope_header(suite, binding.key_epoch) + suite.hpke.encrypt(
        contents.to_bytes(), public_key.hpke, binding.info(suite))


def envelope_header(suite: EnvelopeSuite, key_epoch: int) -> bytes:
    """The blob's clear header: magic, suite code, key epoch (``HEADER_LEN`` bytes)."""
    return MAGIC + bytes([SUITE_CODES[suite]]) + key_epoch.to_bytes(8, "big")


def ciphertext_hash(blob: bytes) -> bytes:
    return hashlib.sha256(blob).digest()


def _binding_of(blob: bytes, bound_to: Receipt | EnvelopeBinding) -> EnvelopeBinding:
    if isinstance(bound_to, Receipt):
        if not isinstance(blob, bytes) or ciphertext_hash(blob) != bound_to.ciphertext_hash:
            raise EnvelopeDecryptionError()
        return EnvelopeBinding.from_receipt(bound_to)
    return bound_to


def _check_header(blob: bytes, binding: EnvelopeBinding, suite: EnvelopeSuite) -> None:
    if (not isinstance(blob, bytes) or len(blob) <= HEADER_LEN or blob[:4] != MAGIC
            or _SUITE_BY_CODE.get(blob[4]) is not suite
            or int.from_bytes(blob[5:HEADER_LEN], "big") != binding.key_epoch):
        raise EnvelopeDecryptionError()


def split_envelope(blob: bytes, bound_to: Receipt | EnvelopeBinding, suite: EnvelopeSuite
                   ) -> tuple[EnvelopeBinding, bytes, bytes]:
    """(binding, enc, AEAD ciphertext) of a blob of a DH-KEM suite whose enc has a fixed
    length (P256: 65 bytes), after the same header and ciphertext-hash checks as
    :func:`open_envelope`. The KMS shards use ``enc`` (E) for per-envelope decapsulation."""
    if not suite.threshold_decapsulable:
        raise EnvelopeDecryptionError()
    binding = _binding_of(blob, bound_to)
    _check_header(blob, binding, suite)
    enc_len = suite.public_key_len
    body = blob[HEADER_LEN:]
    if len(body) <= enc_len:
        raise EnvelopeDecryptionError()
    return binding, body[:enc_len], body[enc_len:]


def _finish(plaintext: bytes, binding: EnvelopeBinding) -> EnvelopeContents:
    try:
        contents = EnvelopeContents.from_bytes(plaintext)
    except ReceiptFormatError as e:
        raise EnvelopeContentError(f"envelope opened but its plaintext is malformed: "
                                   f"{e.message}") from None
    problems = _check_consistent(contents, binding)
    if problems:
        raise EnvelopeContentError("envelope opened but does not match its receipt: "
                                   + "; ".join(problems))
    return contents


def open_envelope(blob: bytes, bound_to: Receipt | EnvelopeBinding,
                  private_key: EpochPrivateKey) -> EnvelopeContents:
    """Decrypt a blob for a receipt (or its binding) with the epoch private key.

    Raises :class:`EnvelopeDecryptionError` for any failure to open (never says which), and
    :class:`EnvelopeContentError` if it opens but the contents do not match the receipt.
    """
    binding = _binding_of(blob, bound_to)
    suite = private_key.suite
    _check_header(blob, binding, suite)
    try:
        plaintext = suite.hpke.decrypt(blob[HEADER_LEN:], private_key.hpke, binding.info(suite))
    except Exception:  # InvalidTag, ValueError on short input, ...: all the same to callers
        raise EnvelopeDecryptionError() from None
    return _finish(plaintext, binding)


def open_envelope_with(blob: bytes, bound_to: Receipt | EnvelopeBinding, suite: EnvelopeSuite,
                       hpke_open: Callable[[bytes, bytes, bytes], bytes]) -> EnvelopeContents:
    """Open without the epoch private key: ``hpke_open(enc, info, ct)`` performs HPKE's Decap
    and Open for this one envelope (the KMS's threshold path, ``verinfer.kms.tdh``). Same
    errors as :func:`open_envelope`; any exception of ``hpke_open`` is a failure to open."""
    binding, enc, ct = split_envelope(blob, bound_to, suite)
    try:
        plaintext = hpke_open(enc, binding.info(suite), ct)
    except Exception:
        raise EnvelopeDecryptionError() from None
    return _finish(plaintext, binding)
