"""One attestation interface for every TEE.

``Attester.quote(report_data)`` produces a ``Quote`` (TEE-native bytes plus the TEE name);
``QuoteVerifier.verify(quote, policy)`` checks the signature chain up to a pinned root, the
quote's age and the measurement allowlist, and returns a ``VerifiedQuote`` (or raises a typed
``AttestationError``). Binding report_data to a particular request is the caller's job: the KMS
shard, a layer above, recomputes it from the request and compares (``report_data`` in the
KMS's protocol module); this package knows nothing of the KMS.

Measurement = sha256 over the length-prefixed container digest, code hash and engine
fingerprint (see ``measurement``). Real TEEs map their own fields to it (docs/kms.md).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from verinfer.attestation.errors import QuoteMalformedError, UnsupportedTeeError
from verinfer.protocol.hexutil import HexFormatError, parse_hex_lenient

REPORT_DATA_LEN = 64  # TDX / SEV-SNP report_data size; Nitro user_data fits it too
MEASUREMENT_LEN = 32
MEASUREMENT_DOMAIN = b"verinfer/enclave/measurement/v1"


@dataclass(frozen=True)
class Quote:
    tee: str  # "software" here; "tdx", "sev-snp", "nitro" later
    raw: bytes  # TEE-native quote bytes

    def to_wire(self) -> dict[str, str]:
        return {"tee": self.tee, "raw": base64.b64encode(self.raw).decode()}

    @classmethod
    def from_wire(cls, d: Any) -> Quote:
        if not isinstance(d, Mapping) or not isinstance(d.get("tee"), str) \
                or not isinstance(d.get("raw"), str):
            raise QuoteMalformedError(f"quote must be {{tee: str, raw: base64}}, got {d!r:.200}")
        try:
            raw = base64.b64decode(d["raw"], validate=True)
        except (binascii.Error, ValueError) as e:
            raise QuoteMalformedError("quote.raw is not base64") from e
        return cls(d["tee"], raw)


@dataclass(frozen=True)
class VerifiedQuote:
    tee: str
    measurement: bytes
    report_data: bytes
    issued_at: int
    root: bytes  # the pinned root key the chain ends at


@dataclass(frozen=True)
class AttestationPolicy:
    """What a verifier accepts. ``software_roots`` pins SoftwareEnclave attestation roots (raw
    Ed25519 public keys); hardware TEEs pin their vendor roots in their own verifiers."""

    allowed_measurements: frozenset[bytes]
    max_age_s: float
    now: Callable[[], float]
    software_roots: frozenset[bytes] = field(default_factory=frozenset)
    max_clock_skew_s: float = 5.0
    #: the key epoch the quote asks for (a shard may accept different TEEs per epoch)
    epoch: int | None = None


class Attester(Protocol):
    tee: str

    def quote(self, report_data: bytes) -> Quote: ...


class QuoteVerifier(Protocol):
    tee: str

    def verify(self, quote: Quote, policy: AttestationPolicy) -> VerifiedQuote: ...


class VerifierSet:
    """Dispatch a quote to the verifier of its TEE; unknown TEEs are refused."""

    tee = "any"

    def __init__(self, verifiers: Iterable[QuoteVerifier]) -> None:
        self._by_tee = {v.tee: v for v in verifiers}

    def verify(self, quote: Quote, policy: AttestationPolicy) -> VerifiedQuote:
        v = self._by_tee.get(quote.tee)
        if v is None:
            raise UnsupportedTeeError(
                f"no verifier for TEE {quote.tee!r}; supported: {sorted(self._by_tee)}")
        return v.verify(quote, policy)


def _lp(b: bytes) -> bytes:
    return len(b).to_bytes(4, "big") + b


def measurement(container_digest: str, code_hash: str, engine_fingerprint: str) -> bytes:
    """sha256(DOMAIN || lp(container digest) || lp(code hash) || lp(engine fingerprint)),
    each a UTF-8 string, lp = 4-byte big-endian length prefix."""
    for name, v in (("container_digest", container_digest), ("code_hash", code_hash),
                    ("engine_fingerprint", engine_fingerprint)):
        if not isinstance(v, str) or not v:
            raise QuoteMalformedError(f"{name} must be a non-empty string, got {v!r}")
    return hashlib.sha256(MEASUREMENT_DOMAIN + _lp(container_digest.encode())
                          + _lp(code_hash.encode()) + _lp(engine_fingerprint.encode())).digest()


def parse_hex(value: Any, length: int, what: str) -> bytes:
    """A quote field: hex of ``length`` bytes. Quotes write bare hex (``bytes.hex()``) and
    older tools wrote ``0x``, so the prefix is optional; the digits are checked strictly."""
    try:
        return parse_hex_lenient(value, length, what)
    except HexFormatError as e:
        raise QuoteMalformedError(e.message) from None
