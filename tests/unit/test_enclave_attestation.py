from __future__ import annotations

from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from verinfer.attestation.errors import (
    MeasurementNotAllowedError,
    QuoteExpiredError,
    QuoteMalformedError,
    QuoteSignatureError,
    RootKeyError,
    UnsupportedTeeError,
)
from verinfer.attestation.quotes import (
    AttestationPolicy,
    Quote,
    VerifierSet,
    measurement,
)
from verinfer.attestation.software import (
    SoftwareAttester,
    SoftwareQuoteVerifier,
    load_root_private,
    load_root_public,
    root_keygen,
)

M = measurement("sha256:" + "ab" * 32, "code-v1", "torch-cpu-fp32")
RD = bytes(range(64))


class Clock:
    def __init__(self, t: float) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def _setup() -> tuple[Ed25519PrivateKey, SoftwareAttester, Clock, AttestationPolicy]:
    root = Ed25519PrivateKey.generate()
    clock = Clock(1_000_000.0)
    att = SoftwareAttester(root, M, clock)
    policy = AttestationPolicy(allowed_measurements=frozenset({M}), max_age_s=60, now=clock,
                               software_roots=frozenset({att.root_public}))
    return root, att, clock, policy


def test_quote_roundtrip() -> None:
    _, att, _, policy = _setup()
    q = att.quote(RD)
    v = SoftwareQuoteVerifier().verify(Quote.from_wire(q.to_wire()), policy)
    assert (v.measurement, v.report_data, v.issued_at, v.root) == (M, RD, 1_000_000,
                                                                  att.root_public)
    assert VerifierSet([SoftwareQuoteVerifier()]).verify(q, policy) == v


def test_forged_and_foreign_quotes_are_refused() -> None:
    _, att, clock, policy = _setup()
    q = att.quote(RD)
    flipped = bytearray(q.raw)
    flipped[20] ^= 1  # inside the signed body
    with pytest.raises((QuoteSignatureError, QuoteMalformedError)):
        SoftwareQuoteVerifier().verify(Quote("software", bytes(flipped)), policy)
    sig_flipped = q.raw[:-1] + bytes([q.raw[-1] ^ 1])
    with pytest.raises(QuoteSignatureError):
        SoftwareQuoteVerifier().verify(Quote("software", sig_flipped), policy)
    other = SoftwareAttester(Ed25519PrivateKey.generate(), M, clock)
    with pytest.raises(QuoteSignatureError, match="unpinned root"):
        SoftwareQuoteVerifier().verify(other.quote(RD), policy)
    # a quote from another root that claims our root in its body
    body_claims_ours = other.quote(RD).raw.replace(other.root_public.hex().encode(),
                                                   att.root_public.hex().encode())
    with pytest.raises(QuoteSignatureError, match="does not verify"):
        SoftwareQuoteVerifier().verify(Quote("software", body_claims_ours), policy)


def test_age_and_measurement_policy() -> None:
    root, att, clock, policy = _setup()
    q = att.quote(RD)
    clock.t += 61
    with pytest.raises(QuoteExpiredError):
        SoftwareQuoteVerifier().verify(q, policy)
    clock.t -= 61 + 30  # quote from 30 s in the future
    with pytest.raises(QuoteExpiredError, match="future"):
        SoftwareQuoteVerifier().verify(q, policy)
    clock.t += 30
    # same pinned root, a measurement that is not allowlisted
    other_m = SoftwareAttester(root, measurement("x", "y", "z"), clock)
    with pytest.raises(MeasurementNotAllowedError):
        SoftwareQuoteVerifier().verify(other_m.quote(RD), policy)


def test_malformed_inputs() -> None:
    _, att, _, policy = _setup()
    with pytest.raises(QuoteMalformedError):
        att.quote(b"short")
    with pytest.raises(QuoteMalformedError):
        SoftwareQuoteVerifier().verify(Quote("software", b"garbage"), policy)
    with pytest.raises(QuoteMalformedError):
        Quote.from_wire({"tee": "software", "raw": "***"})
    with pytest.raises(QuoteMalformedError):
        Quote.from_wire(["not", "a", "dict"])
    with pytest.raises(UnsupportedTeeError):
        VerifierSet([SoftwareQuoteVerifier()]).verify(Quote("tdx", b"x"), policy)
    with pytest.raises(QuoteMalformedError):
        measurement("", "code", "fp")


def test_measurement_is_domain_separated_and_unambiguous() -> None:
    assert measurement("a", "bc", "d") != measurement("ab", "c", "d")
    assert measurement("a", "b", "c") == measurement("a", "b", "c")
    assert len(M) == 32


def test_root_key_files(tmp_path: Path) -> None:
    pub = root_keygen(tmp_path / "root.key", tmp_path / "root.pub")
    assert load_root_public(tmp_path / "root.pub") == pub
    priv = load_root_private(tmp_path / "root.key")
    assert priv.public_key().public_bytes_raw() == pub
    assert (tmp_path / "root.key").stat().st_mode & 0o777 == 0o600
    with pytest.raises(RootKeyError):
        root_keygen(tmp_path / "root.key", tmp_path / "root.pub")
    (tmp_path / "bad.pub").write_text("abcd")
    with pytest.raises(RootKeyError):
        load_root_public(tmp_path / "bad.pub")
