"""SoftwareEnclave: a software stand-in for a TEE. NOT A SECURITY BOUNDARY.

Its quotes are signed by a local "attestation root" Ed25519 key that plays the part of the
hardware vendor's root of trust. Whoever holds that key can forge quotes, and the host can read
the enclave process's memory. It exists so that the whole key-release protocol (nonces,
report_data binding, measurement allowlist, share transport, reconstruction) runs and is tested
end to end; real TEEs plug in behind ``Attester`` / ``QuoteVerifier`` (docs/kms.md).

Quote raw bytes: b"VSWQ1" || u32 body length || body || 64-byte Ed25519 signature over
(b"VSWQ1" || u32 length || body). body = RFC 8785 canonical JSON
{"issued_at": int, "measurement": hex, "report_data": hex, "root": hex, "tee": "software",
 "v": 1}.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import rfc8785
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from verinfer.attestation.errors import (
    MeasurementNotAllowedError,
    QuoteExpiredError,
    QuoteMalformedError,
    QuoteSignatureError,
    RootKeyError,
)
from verinfer.attestation.quotes import (
    MEASUREMENT_LEN,
    REPORT_DATA_LEN,
    AttestationPolicy,
    Quote,
    VerifiedQuote,
    parse_hex,
)
from verinfer.protocol.hexutil import parse_hex_lenient
from verinfer.protocol.jsonsafe import UntrustedJsonError, loads_untrusted

TEE = "software"
MAGIC = b"VSWQ1"


# ---- attestation root keys ----------------------------------------------------------------
def root_keygen(private_path: Path, public_path: Path) -> bytes:
    """Write a new root key pair (private hex, mode 0600; public hex). Returns the public key."""
    if private_path.exists():
        raise RootKeyError(f"root key {private_path} already exists")
    key = Ed25519PrivateKey.generate()
    private_path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(private_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(key.private_bytes_raw().hex() + "\n")
    pub = key.public_key().public_bytes_raw()
    public_path.parent.mkdir(parents=True, exist_ok=True)
    public_path.write_text(pub.hex() + "\n")
    return pub


def load_root_private(path: Path) -> Ed25519PrivateKey:
    return Ed25519PrivateKey.from_private_bytes(_read_hex(path, 32, "root private key"))


def load_root_public(path: Path) -> bytes:
    raw = _read_hex(path, 32, "root public key")
    Ed25519PublicKey.from_public_bytes(raw)
    return raw


def _read_hex(path: Path, length: int, what: str) -> bytes:
    try:
        text = path.read_text().strip()
        # written bare by this module; a person may paste it with 0x: the prefix is optional
        raw = parse_hex_lenient(text, None, what)
    except OSError as e:
        raise RootKeyError(f"cannot read {what} from {path}: {e}") from e
    except ValueError:  # HexFormatError; never echo (part of) a private key into the error
        raise RootKeyError(f"{what} in {path} is not hex") from None
    if len(raw) != length:
        raise RootKeyError(f"{what} in {path} must be {length} bytes, got {len(raw)}")
    return raw


# ---- quoting ------------------------------------------------------------------------------
class SoftwareAttester:
    """Attester of a SoftwareEnclave. Not a security boundary: see the module doc."""

    tee = TEE

    def __init__(self, root_key: Ed25519PrivateKey, measurement: bytes,
                 now: Callable[[], float]) -> None:
        if len(measurement) != MEASUREMENT_LEN:
            raise QuoteMalformedError(f"measurement must be {MEASUREMENT_LEN} bytes")
        self._root = root_key
        self.root_public = root_key.public_key().public_bytes_raw()
        self.measurement = measurement
        self._now = now

    def quote(self, report_data: bytes) -> Quote:
        if len(report_data) != REPORT_DATA_LEN:
            raise QuoteMalformedError(
                f"report_data must be {REPORT_DATA_LEN} bytes, got {len(report_data)}")
        body = rfc8785.dumps({"issued_at": int(self._now()), "measurement": self.measurement.hex(),
                              "report_data": report_data.hex(), "root": self.root_public.hex(),
                              "tee": TEE, "v": 1})
        signed = MAGIC + len(body).to_bytes(4, "big") + body
        return Quote(TEE, signed + self._root.sign(signed))


class SoftwareQuoteVerifier:
    """Checks, in order: format, signature by a pinned root, age, measurement allowlist."""

    tee = TEE

    def verify(self, quote: Quote, policy: AttestationPolicy) -> VerifiedQuote:
        raw = quote.raw
        if quote.tee != TEE or len(raw) < len(MAGIC) + 4 + 64 or not raw.startswith(MAGIC):
            raise QuoteMalformedError("not a software-enclave quote")
        n = int.from_bytes(raw[len(MAGIC):len(MAGIC) + 4], "big")
        signed_end = len(MAGIC) + 4 + n
        if len(raw) != signed_end + 64:
            raise QuoteMalformedError(f"quote length {len(raw)} does not match body length {n}")
        body = _parse_body(raw[len(MAGIC) + 4:signed_end])
        root = parse_hex(body.get("root"), 32, "quote.root")
        if root not in policy.software_roots:
            raise QuoteSignatureError(f"quote signed by unpinned root {root.hex()}")
        try:
            Ed25519PublicKey.from_public_bytes(root).verify(raw[signed_end:], raw[:signed_end])
        except InvalidSignature as e:
            raise QuoteSignatureError("quote signature does not verify under its root") from e
        issued_at = body.get("issued_at")
        if not isinstance(issued_at, int):
            raise QuoteMalformedError(f"quote.issued_at must be an int, got {issued_at!r}")
        now = policy.now()
        if now - issued_at > policy.max_age_s:
            raise QuoteExpiredError(
                f"quote issued at {issued_at} is {now - issued_at:.0f}s old "
                f"(max {policy.max_age_s:.0f}s)")
        if issued_at - now > policy.max_clock_skew_s:
            raise QuoteExpiredError(
                f"quote issued at {issued_at} lies in the future (now {now:.0f})")
        meas = parse_hex(body.get("measurement"), MEASUREMENT_LEN, "quote.measurement")
        if meas not in policy.allowed_measurements:
            raise MeasurementNotAllowedError(f"measurement 0x{meas.hex()} is not allowlisted")
        rd = parse_hex(body.get("report_data"), REPORT_DATA_LEN, "quote.report_data")
        return VerifiedQuote(TEE, meas, rd, issued_at, root)


def _parse_body(b: bytes) -> dict[str, Any]:
    try:  # a quote arrives from the requester: hostile bytes until proven otherwise
        body = loads_untrusted(b, max_bytes=16 * 1024, what="quote body")
    except UntrustedJsonError as e:
        raise QuoteMalformedError(f"quote body is not acceptable JSON: {e.message}") from e
    if not isinstance(body, dict) or body.get("v") != 1 or body.get("tee") != TEE:
        raise QuoteMalformedError(f"unsupported quote body: {body!r:.200}")
    return body
