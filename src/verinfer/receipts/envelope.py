"""The encrypted envelope: HPKE (RFC 9180) of the canonical (ExecRequest, ExecResult, original
OpenAI request body, original response body) to the app public key of a key epoch.

Blob (what goes to DA; ``ciphertextHash = sha256(blob)``)::

    b"VIE" || format version (1 byte) || suite code (1 byte: 1 = X25519,
    2 = MLKEM768_X25519, 3 = P256) || key_epoch (u64 BE) || body

    version 1 (X25519, MLKEM768_X25519): body = HPKE single-shot output (enc || AEAD ct)
    version 2 (P256, the per-receipt suite): body = enc (65) || proof (64) || AEAD ct

The version is the suite's: a P256 envelope must be version 2 (version 1, without the proof,
is not read), the other suites stay version 1. The proof (``receipts/encapsulation.py``) shows
the sealer knew e = log_G(enc); it is bound to ``pok_context`` = header || lp(info) ||
sha256(AEAD ct), info being the receipt binding below. KMS shards decrypt a P256 envelope by
computing s_i·enc, so without the proof an operator could put another envelope's enc into its
own receipt's blob and have a challenge of that receipt open the other envelope.

HPKE ``info`` (``cryptography``'s single-shot API has no separate aad, so all binding goes
through info and thus into the key schedule)::

    b"verinfer/envelope/v1" || suite_id (10 bytes, RFC 9180) || version (u16) || chainId (u256)
    || operator (20) || modelId (32) || engineFingerprintHash (32) || reqHash (32)
    || outHash (32) || keyEpoch (u64)

That is every receipt field except ciphertextHash (it hashes this blob) and issuedAt (set after
sealing), so a ciphertext moved under another receipt does not open. Every failure to open
raises :class:`EnvelopeDecryptionError` (for P256, its subclasses name a bad enc or proof).
The ephemeral key is drawn from the OS RNG inside ``cryptography``; sealing is therefore not
reproducible, which is intended.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from cryptography.hazmat.primitives.asymmetric import ec

from verinfer.protocol.errors import ReceiptFormatError, UnsupportedVersionError
from verinfer.protocol.exec_request import CborBound, ExecRequest, decode_cbor, encode_canonical
from verinfer.protocol.fields import check_bytes, check_uint, parse_hex
from verinfer.protocol.hexutil import to_hex
from verinfer.receipts import encapsulation
from verinfer.receipts.canonical import ExecResult
from verinfer.receipts.eip712 import RECEIPT_VERSION, Receipt, parse_address
from verinfer.receipts.epoch_keys import (
    EnvelopeSuite,
    EpochPrivateKey,
    EpochPublicKey,
)
from verinfer.receipts.errors import EnvelopeContentError, EnvelopeDecryptionError

__all__ = ["EnvelopeBinding", "EnvelopeContents", "envelope_header", "open_envelope",
           "open_envelope_with", "pok_context", "seal", "seal_plaintext", "split_envelope"]

# The plaintext map's own version (its keys), independent of the ExecRequest/ExecResult
# versions inside it. 2: the Padmé ``padding`` entry is required (version 1, without it, never
# shipped and is not read: a format change bumps this number instead of growing a second parser).
ENVELOPE_VERSION = 2
#: The plaintext map's 6 keys and 6 values (the structures sit in it as byte strings): what
#: the one CBOR decoder lets it hold, so a bomb in it is refused at its 14th item.
ENVELOPE_CBOR = CborBound(items=13, containers=1, strings=11)
LABEL = b"verinfer/envelope/v1"
MAGIC_PREFIX = b"VIE"
#: The blob format version of each suite (the byte after ``VIE``). 2: a P256 envelope carries
#: the proof of knowledge of its ephemeral secret; version-1 P256 blobs are not read.
FORMAT_VERSIONS = {EnvelopeSuite.X25519: 1, EnvelopeSuite.MLKEM768_X25519: 1,
                   EnvelopeSuite.P256: 2}
#: The magic of the version-1 suites (X25519, MLKEM768_X25519).
MAGIC = MAGIC_PREFIX + b"\x01"
SUITE_CODES = {EnvelopeSuite.X25519: 1, EnvelopeSuite.MLKEM768_X25519: 2, EnvelopeSuite.P256: 3}
_SUITE_BY_CODE = {v: k for k, v in SUITE_CODES.items()}
HEADER_LEN = len(MAGIC) + 1 + 8
#: P256 body: enc, then the proof of knowledge of log_G(enc), then the AEAD ciphertext.
P256_ENC_LEN = encapsulation.ENC_LEN
P256_PROOF_LEN = encapsulation.PROOF_LEN


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
    return seal_plaintext(contents.to_bytes(), binding, public_key)


def seal_plaintext(plaintext: bytes, binding: EnvelopeBinding,
                   public_key: EpochPublicKey) -> bytes:
    """The blob of ``plaintext`` under ``binding`` without :func:`seal`'s check that the
    contents match the binding (an honest sealer calls :func:`seal`; the dishonest-operator
    fixtures call this to publish envelopes that open but do not match their receipt)."""
    suite = public_key.suite
    header = envelope_header(suite, binding.key_epoch)
    info = binding.info(suite)
    if suite is EnvelopeSuite.P256:
        if not isinstance(public_key.hpke, ec.EllipticCurvePublicKey):
            raise ReceiptFormatError("a p256 epoch key must be a P-256 public key",
                                     param="public_key")
        enc, proof, ct = encapsulation.seal(
            plaintext, public_key.hpke, info, lambda e, c: pok_context(header, info, c))
        return header + enc + proof + ct
    return header + suite.hpke.encrypt(plaintext, public_key.hpke, info)


def pok_context(header: bytes, info: bytes, ct: bytes) -> bytes:
    """What a P256 envelope's proof of knowledge of log_G(enc) is bound to: the blob's header
    (format, suite, key epoch), the receipt binding (HPKE info: every receipt field but
    ciphertextHash, which hashes the blob and so the proof, and issuedAt) and sha256 of the AEAD
    ciphertext. A proof copied with its enc into another receipt's or envelope's blob fails."""
    return header + len(info).to_bytes(4, "big") + info + hashlib.sha256(ct).digest()


def envelope_header(suite: EnvelopeSuite, key_epoch: int) -> bytes:
    """The blob's clear header: magic with the suite's format version, suite code, key epoch
    (``HEADER_LEN`` bytes)."""
    return (MAGIC_PREFIX + bytes([FORMAT_VERSIONS[suite], SUITE_CODES[suite]])
            + key_epoch.to_bytes(8, "big"))


def ciphertext_hash(blob: bytes) -> bytes:
    return hashlib.sha256(blob).digest()


def _binding_of(blob: bytes, bound_to: Receipt | EnvelopeBinding) -> EnvelopeBinding:
    if isinstance(bound_to, Receipt):
        if not isinstance(blob, bytes) or ciphertext_hash(blob) != bound_to.ciphertext_hash:
            raise EnvelopeDecryptionError()
        return EnvelopeBinding.from_receipt(bound_to)
    return bound_to


def _check_header(blob: bytes, binding: EnvelopeBinding, suite: EnvelopeSuite) -> None:
    if (not isinstance(blob, bytes) or len(blob) <= HEADER_LEN or blob[:3] != MAGIC_PREFIX
            or blob[3] != FORMAT_VERSIONS[suite] or _SUITE_BY_CODE.get(blob[4]) is not suite
            or int.from_bytes(blob[5:HEADER_LEN], "big") != binding.key_epoch):
        raise EnvelopeDecryptionError()


def split_envelope(blob: bytes, bound_to: Receipt | EnvelopeBinding, suite: EnvelopeSuite
                   ) -> tuple[EnvelopeBinding, bytes, bytes]:
    """(binding, enc, AEAD ciphertext) of a P256 (version 2) blob, after the same header and
    ciphertext-hash checks as :func:`open_envelope` and the check of the proof of knowledge of
    log_G(enc) against this blob's context (:func:`pok_context`): a malformed enc or proof
    raises :class:`EncapsulationMalformedError`, a proof made for another envelope or receipt
    :class:`EncapsulationProofError` (both :class:`EnvelopeDecryptionError`). The KMS shards
    use ``enc`` (E) for per-envelope decapsulation, and only after this check."""
    if not suite.threshold_decapsulable:
        raise EnvelopeDecryptionError()
    binding = _binding_of(blob, bound_to)
    _check_header(blob, binding, suite)
    body = blob[HEADER_LEN:]
    if len(body) <= P256_ENC_LEN + P256_PROOF_LEN:
        raise EnvelopeDecryptionError()
    enc = body[:P256_ENC_LEN]
    proof = body[P256_ENC_LEN:P256_ENC_LEN + P256_PROOF_LEN]
    ct = body[P256_ENC_LEN + P256_PROOF_LEN:]
    info = binding.info(suite)
    encapsulation.verify_encapsulation(enc, proof, pok_context(blob[:HEADER_LEN], info, ct))
    return binding, enc, ct


def _split_opaque(blob: bytes, bound_to: Receipt | EnvelopeBinding, suite: EnvelopeSuite
                  ) -> tuple[EnvelopeBinding, bytes, bytes]:
    """:func:`split_envelope` for the openers, whose every failure is the one opaque error
    (the shards and the runner's pre-check call split_envelope and get the reason)."""
    try:
        return split_envelope(blob, bound_to, suite)
    except EnvelopeDecryptionError:
        raise EnvelopeDecryptionError() from None


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
    if suite.threshold_decapsulable:  # enc || proof || ct: the proof checked, then enc || ct
        _, enc, ct = _split_opaque(blob, binding, suite)
        hpke_output = enc + ct
    else:
        hpke_output = blob[HEADER_LEN:]
    try:
        plaintext = suite.hpke.decrypt(hpke_output, private_key.hpke, binding.info(suite))
    except Exception:  # InvalidTag, ValueError on short input, ...: all the same to callers
        raise EnvelopeDecryptionError() from None
    return _finish(plaintext, binding)


def open_envelope_with(blob: bytes, bound_to: Receipt | EnvelopeBinding, suite: EnvelopeSuite,
                       hpke_open: Callable[[bytes, bytes, bytes], bytes]) -> EnvelopeContents:
    """Open without the epoch private key: ``hpke_open(enc, info, ct)`` performs HPKE's Decap
    and Open for this one envelope (the KMS's threshold path, ``verinfer.kms.tdh``). Same
    errors as :func:`open_envelope`; any exception of ``hpke_open`` is a failure to open."""
    binding, enc, ct = _split_opaque(blob, bound_to, suite)
    try:
        plaintext = hpke_open(enc, binding.info(suite), ct)
    except Exception:
        raise EnvelopeDecryptionError() from None
    return _finish(plaintext, binding)
