"""Intel TDX: quote verification against Intel's root (dcap-qvl) and a small configfs-tsm
attester.

Evidence a TD sends (``Quote(tee="tdx", raw=TdxEvidence(...).encode())``):

    b"VTDX1" || lp(quote) || lp(collateral JSON) || u16 n || n x (lp(name) || lp(payload))
    lp(x) = u32 big-endian length || x

- ``quote``: the TDX v4/v5 quote as the guest's quote generation returns it;
- ``collateral``: Intel's public collateral for that platform (PCK CRL + chain, root CA CRL,
  TCB info + chain + signature, QE identity + chain + signature), in dcap-qvl's
  ``QuoteCollateralV3`` JSON. The requester fetches it (a PCCS cache or Intel PCS) and sends it
  with the quote, so a shard needs no network at release time; every byte of it is checked
  against the pinned Intel SGX Root CA, so whoever supplies it can only make a quote fail;
- the RTMR3 event log: each event (name, payload) was extended by the TD as
  RTMR3 = SHA-384(RTMR3 || SHA-384(lp(name) || lp(payload))), starting from 48 zero bytes.

Checks, in order (the first failure is the refusal; every one has its own ``code``):
 1. evidence framing, quote parses, the quote is a TDX quote     quote_malformed / quote_not_tdx
 2. collateral parses, is TDX collateral for this quote's FMSPC,  collateral_malformed /
    and every dated item is valid at ``now``                      collateral_mismatch /
                                                                  collateral_not_yet_valid /
                                                                  collateral_expired
 3. dcap-qvl: quote signature by the attestation key, QE report signature and hash, PCK chain
    to the pinned root, CRLs, TCB info and QE identity signatures, TCB level
                                      quote_signature_invalid / collateral_signature_invalid /
                                      pck_revoked / tcb_platform_refused / ...
 4. TCB status and advisory ids accepted by the policy   tcb_status_not_accepted /
                                                         advisory_not_accepted
 5. TD attributes: no TUD bit (debug) set                            td_debug
 6. MRTD and RTMR0-2 equal one allow-listed platform                 mrtd_not_allowed /
                                                                     rtmr_not_allowed
 7. the event log replays to the quote's RTMR3                       rtmr3_mismatch
 8. the log names exactly one image digest, code hash and engine fingerprint and nothing
    unlisted; verinfer's measurement is derived from those replayed values
                                     event_log_incomplete / event_log_unexpected_event /
                                     measurement_not_allowed
 9. report_data equals the expected binding (when the caller gives one)  report_data_mismatch

dcap-qvl checks signatures, chains, CRLs and TCB only; measurements, the debug bit and
report_data are ours (steps 5-9). Read docs/attestation.md for what each field proves.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from pathlib import Path
from typing import Any

from verinfer.attestation.errors import (
    AttestationError,
    MeasurementNotAllowedError,
    QuoteExpiredError,
    QuoteMalformedError,
    QuoteSignatureError,
    UnsupportedTeeError,
)
from verinfer.attestation.quotes import (
    MEASUREMENT_LEN,
    REPORT_DATA_LEN,
    AttestationPolicy,
    Quote,
    VerifiedQuote,
    measurement,
)
from verinfer.protocol.hexutil import HexFormatError, parse_hex_lenient
from verinfer.protocol.jsonsafe import UntrustedJsonError, loads_untrusted

TEE = "tdx"
MAGIC = b"VTDX1"
RTMR_LEN = 48  # SHA-384
#: Bounds on evidence a shard reads (a v4 quote with its PCK chain is ~5 KB, collateral ~16 KB).
MAX_QUOTE_BYTES = 32 * 1024
MAX_COLLATERAL_BYTES = 96 * 1024
MAX_EVENTS = 64
MAX_EVENT_NAME = 64
MAX_EVENT_PAYLOAD = 1024

#: RTMR3 event names whose payloads make up verinfer's measurement (UTF-8 strings).
EVENT_IMAGE_DIGEST = "verinfer.image_digest"  # OCI image digest, "sha256:…"
EVENT_CODE_HASH = "verinfer.code_hash"
EVENT_ENGINE_FINGERPRINT = "verinfer.engine_fingerprint"
REQUIRED_EVENTS = (EVENT_IMAGE_DIGEST, EVENT_CODE_HASH, EVENT_ENGINE_FINGERPRINT)

TCB_STATUSES = ("UpToDate", "SWHardeningNeeded", "ConfigurationNeeded",
                "ConfigurationAndSWHardeningNeeded", "OutOfDate",
                "OutOfDateConfigurationNeeded")

#: Intel SGX Root CA (the root of every DCAP chain, SGX and TDX alike), pinned here rather than
#: taken from the library so that a dependency update cannot move our trust anchor.
#: SHA-256 of the DER: 44a0196b2b99f889b8e149e95b807a350e7424964399e885a7cbb8ccfab674d3.
INTEL_SGX_ROOT_CA_PEM = b"""-----BEGIN CERTIFICATE-----
MIICjzCCAjSgAwIBAgIUImUM1lqdNInzg7SVUr9QGzknBqwwCgYIKoZIzj0EAwIw
aDEaMBgGA1UEAwwRSW50ZWwgU0dYIFJvb3QgQ0ExGjAYBgNVBAoMEUludGVsIENv
cnBvcmF0aW9uMRQwEgYDVQQHDAtTYW50YSBDbGFyYTELMAkGA1UECAwCQ0ExCzAJ
BgNVBAYTAlVTMB4XDTE4MDUyMTEwNDUxMFoXDTQ5MTIzMTIzNTk1OVowaDEaMBgG
A1UEAwwRSW50ZWwgU0dYIFJvb3QgQ0ExGjAYBgNVBAoMEUludGVsIENvcnBvcmF0
aW9uMRQwEgYDVQQHDAtTYW50YSBDbGFyYTELMAkGA1UECAwCQ0ExCzAJBgNVBAYT
AlVTMFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAEC6nEwMDIYZOj/iPWsCzaEKi7
1OiOSLRFhWGjbnBVJfVnkY4u3IjkDYYL0MxO4mqsyYjlBalTVYxFP2sJBK5zlKOB
uzCBuDAfBgNVHSMEGDAWgBQiZQzWWp00ifODtJVSv1AbOScGrDBSBgNVHR8ESzBJ
MEegRaBDhkFodHRwczovL2NlcnRpZmljYXRlcy50cnVzdGVkc2VydmljZXMuaW50
ZWwuY29tL0ludGVsU0dYUm9vdENBLmRlcjAdBgNVHQ4EFgQUImUM1lqdNInzg7SV
Ur9QGzknBqwwDgYDVR0PAQH/BAQDAgEGMBIGA1UdEwEB/wQIMAYBAf8CAQEwCgYI
KoZIzj0EAwIDSQAwRgIhAOW/5QkR+S9CiSDcNoowLuPRLsWGf/Yi7GSX94BgwTwg
AiEA4J0lrHoMs+Xo5o/sX6O9QWxHRAvZUGOdRQ7cvqRXaqI=
-----END CERTIFICATE-----
"""
INTEL_SGX_ROOT_CA_SHA256 = "44a0196b2b99f889b8e149e95b807a350e7424964399e885a7cbb8ccfab674d3"


# ---- refusals -----------------------------------------------------------------------------
class QuoteNotTdxError(UnsupportedTeeError):
    """Offered as TDX but the quote is another TEE's (e.g. an SGX enclave quote)."""

    code = "quote_not_tdx"


class CollateralMalformedError(QuoteMalformedError):
    code = "collateral_malformed"


class CollateralMismatchError(AttestationError):
    """The collateral is not for this quote (another TEE type or platform family)."""

    code = "collateral_mismatch"


class CollateralExpiredError(QuoteExpiredError):
    code = "collateral_expired"


class CollateralNotYetValidError(QuoteExpiredError):
    code = "collateral_not_yet_valid"


class CollateralSignatureError(QuoteSignatureError):
    code = "collateral_signature_invalid"


class PckRevokedError(QuoteSignatureError):
    code = "pck_revoked"


class TcbPlatformRefusedError(AttestationError):
    """dcap-qvl's platform policy refused (dynamic platform, cached keys, SMT, TCB eval
    data number)."""

    code = "tcb_platform_refused"


class TcbStatusNotAcceptedError(AttestationError):
    code = "tcb_status_not_accepted"


class AdvisoryNotAcceptedError(AttestationError):
    code = "advisory_not_accepted"


class TdDebugError(AttestationError):
    code = "td_debug"


class MrtdNotAllowedError(MeasurementNotAllowedError):
    code = "mrtd_not_allowed"


class RtmrNotAllowedError(MeasurementNotAllowedError):
    code = "rtmr_not_allowed"


class Rtmr3MismatchError(MeasurementNotAllowedError):
    code = "rtmr3_mismatch"


class EventLogIncompleteError(MeasurementNotAllowedError):
    code = "event_log_incomplete"


class EventLogUnexpectedEventError(MeasurementNotAllowedError):
    code = "event_log_unexpected_event"


class TdxReportDataMismatchError(AttestationError):
    code = "report_data_mismatch"


class QuoteVerificationFailedError(AttestationError):
    """dcap-qvl refused for a reason we do not map to a narrower code (its text is kept)."""

    code = "quote_verification_failed"


# ---- evidence framing ---------------------------------------------------------------------
def _lp(b: bytes) -> bytes:
    return len(b).to_bytes(4, "big") + b


@dataclass(frozen=True)
class TdxEvidence:
    quote: bytes
    collateral: bytes  # QuoteCollateralV3 JSON text (UTF-8)
    event_log: tuple[tuple[str, bytes], ...] = ()

    def encode(self) -> bytes:
        out = [MAGIC, _lp(self.quote), _lp(self.collateral),
               len(self.event_log).to_bytes(2, "big")]
        for name, payload in self.event_log:
            out.append(_lp(name.encode()) + _lp(payload))
        return b"".join(out)

    @classmethod
    def decode(cls, raw: bytes) -> TdxEvidence:
        """Parse hostile bytes; every bound is checked before anything is allocated."""
        r = _Reader(raw)
        if r.take(len(MAGIC), "magic") != MAGIC:
            raise QuoteMalformedError("not TDX evidence (bad magic)")
        quote = r.lp(MAX_QUOTE_BYTES, "quote")
        collateral = r.lp(MAX_COLLATERAL_BYTES, "collateral")
        n = int.from_bytes(r.take(2, "event count"), "big")
        if n > MAX_EVENTS:
            raise QuoteMalformedError(f"event log has {n} events, at most {MAX_EVENTS}")
        events = []
        for i in range(n):
            name_b = r.lp(MAX_EVENT_NAME, f"event {i} name")
            try:
                name = name_b.decode("utf-8")
            except UnicodeDecodeError as e:
                raise QuoteMalformedError(f"event {i} name is not UTF-8") from e
            events.append((name, r.lp(MAX_EVENT_PAYLOAD, f"event {i} payload")))
        if r.pos != len(raw):
            raise QuoteMalformedError(f"{len(raw) - r.pos} trailing bytes after the evidence")
        return cls(quote, collateral, tuple(events))


class _Reader:
    def __init__(self, raw: bytes) -> None:
        self.raw, self.pos = raw, 0

    def take(self, n: int, what: str) -> bytes:
        if self.pos + n > len(self.raw):
            raise QuoteMalformedError(f"TDX evidence truncated in {what}")
        b = self.raw[self.pos:self.pos + n]
        self.pos += n
        return b

    def lp(self, limit: int, what: str) -> bytes:
        n = int.from_bytes(self.take(4, what + " length"), "big")
        if n > limit:
            raise QuoteMalformedError(f"{what} of {n} bytes exceeds {limit}")
        return self.take(n, what)


# ---- RTMR3 event log ----------------------------------------------------------------------
def event_digest(name: str, payload: bytes) -> bytes:
    return hashlib.sha384(_lp(name.encode()) + _lp(payload)).digest()


def replay_rtmr3(events: Iterable[tuple[str, bytes]]) -> bytes:
    """RTMR3 after extending each event's digest, from the reset value (48 zero bytes)."""
    rtmr = bytes(RTMR_LEN)
    for name, payload in events:
        rtmr = hashlib.sha384(rtmr + event_digest(name, payload)).digest()
    return rtmr


def verinfer_events(image_digest: str, code_hash: str,
                    engine_fingerprint: str) -> tuple[tuple[str, bytes], ...]:
    """The RTMR3 events a verinfer TD extends before it asks for keys."""
    return ((EVENT_IMAGE_DIGEST, image_digest.encode()), (EVENT_CODE_HASH, code_hash.encode()),
            (EVENT_ENGINE_FINGERPRINT, engine_fingerprint.encode()))


def measurement_from_events(events: Sequence[tuple[str, bytes]],
                            extra_allowed: frozenset[str] = frozenset()) -> bytes | None:
    """verinfer's 32-byte measurement from a (replay-checked) log, the same function as the
    software enclave's so one allow-list entry names one image whatever the TEE. None when the
    log lacks one of the required events; refuses duplicates and unlisted names."""
    seen: dict[str, str] = {}
    for name, payload in events:
        if name in REQUIRED_EVENTS:
            if name in seen:
                # a second image extended after the first: which one runs is not knowable
                raise EventLogUnexpectedEventError(f"event {name!r} appears twice in RTMR3")
            try:
                seen[name] = payload.decode("utf-8")
            except UnicodeDecodeError as e:
                raise EventLogUnexpectedEventError(f"event {name!r} is not UTF-8") from e
        elif name not in extra_allowed:
            raise EventLogUnexpectedEventError(
                f"RTMR3 event {name!r} is not one the policy knows (the TD ran something "
                "it did not declare)")
    if any(n not in seen or not seen[n] for n in REQUIRED_EVENTS):
        return None
    return measurement(seen[EVENT_IMAGE_DIGEST], seen[EVENT_CODE_HASH],
                       seen[EVENT_ENGINE_FINGERPRINT])


# ---- policy -------------------------------------------------------------------------------
@dataclass(frozen=True)
class TdxPlatform:
    """One allow-listed CVM: firmware (MRTD), and RTMR0-2 (firmware config, kernel + initrd,
    command line), each 48 bytes. Allow-listed as a tuple: parts of two images never mix."""

    mrtd: bytes
    rtmr0: bytes
    rtmr1: bytes
    rtmr2: bytes

    @classmethod
    def from_json(cls, d: Any) -> TdxPlatform:
        if not isinstance(d, Mapping):
            raise ValueError(f"platform must be an object with mrtd, rtmr0..2, got {d!r:.100}")
        return cls(*(_hex48(d.get(k), k) for k in ("mrtd", "rtmr0", "rtmr1", "rtmr2")))

    def to_json(self) -> dict[str, str]:
        return {"mrtd": self.mrtd.hex(), "rtmr0": self.rtmr0.hex(), "rtmr1": self.rtmr1.hex(),
                "rtmr2": self.rtmr2.hex()}


def _hex48(v: Any, what: str) -> bytes:
    return _hex_n(v, RTMR_LEN, what)


@dataclass(frozen=True)
class TdxPolicy:
    """What a TDX quote must satisfy beyond Intel's signatures.

    ``platforms`` / ``measurements`` None means "not checked": for inspecting a quote only
    (``verinfer enclave verify-quote`` without ``--policy``); ``TdxQuoteVerifier`` refuses to
    run without a platform list and always checks measurements. The three dcap-qvl platform
    flags default to allowed because the public clouds' TDX hosts set them (the sample is
    such a host); a shard holder who can require otherwise sets them False.
    """

    accepted_tcb_statuses: frozenset[str] = frozenset({"UpToDate"})
    accepted_advisory_ids: frozenset[str] = frozenset()
    platforms: frozenset[TdxPlatform] | None = None
    measurements: frozenset[bytes] | None = None
    extra_event_names: frozenset[str] = frozenset()
    expected_report_data: bytes | None = None
    allow_dynamic_platform: bool = True
    allow_cached_keys: bool = True
    allow_smt: bool = True
    min_tcb_eval_data_number: int | None = None

    @classmethod
    def from_json(cls, d: Any) -> TdxPolicy:
        """{"accepted_tcb_statuses": [...], "accepted_advisory_ids": [...],
        "platforms": [{"mrtd", "rtmr0", "rtmr1", "rtmr2"}], "measurements": ["0x…32"],
        "extra_event_names": [...], "allow_dynamic_platform": bool, "allow_cached_keys": bool,
        "allow_smt": bool, "min_tcb_eval_data_number": int}; unknown keys are an error (a
        misspelt key must not silently loosen the policy)."""
        if not isinstance(d, Mapping):
            raise ValueError("policy must be a JSON object")
        known = {"accepted_tcb_statuses", "accepted_advisory_ids", "platforms", "measurements",
                 "extra_event_names", "allow_dynamic_platform", "allow_cached_keys",
                 "allow_smt", "min_tcb_eval_data_number"}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"unknown policy keys {unknown}; known: {sorted(known)}")
        statuses = _str_set(d.get("accepted_tcb_statuses", ["UpToDate"]), "accepted_tcb_statuses")
        bad = sorted(statuses - set(TCB_STATUSES))
        if bad:  # "Revoked" can never be accepted; a typo must not pass silently
            raise ValueError(f"unknown TCB statuses {bad}; known: {list(TCB_STATUSES)}")
        platforms = d.get("platforms")
        measurements = d.get("measurements")
        flags: dict[str, bool] = {}
        for k in ("allow_dynamic_platform", "allow_cached_keys", "allow_smt"):
            v = d.get(k, True)
            if not isinstance(v, bool):
                raise ValueError(f"{k} must be true or false")
            flags[k] = v
        min_eval = d.get("min_tcb_eval_data_number")
        if min_eval is not None and (not isinstance(min_eval, int) or isinstance(min_eval, bool)
                                     or min_eval < 0):
            raise ValueError("min_tcb_eval_data_number must be a non-negative int")
        return cls(
            accepted_tcb_statuses=statuses,
            accepted_advisory_ids=_str_set(d.get("accepted_advisory_ids", []),
                                           "accepted_advisory_ids"),
            platforms=(None if platforms is None else
                       frozenset(TdxPlatform.from_json(p) for p in _list(platforms, "platforms"))),
            measurements=(None if measurements is None else
                          frozenset(_hex_n(m, MEASUREMENT_LEN, "measurement")
                                    for m in _list(measurements, "measurements"))),
            extra_event_names=_str_set(d.get("extra_event_names", []), "extra_event_names"),
            min_tcb_eval_data_number=min_eval,
            allow_dynamic_platform=flags["allow_dynamic_platform"],
            allow_cached_keys=flags["allow_cached_keys"], allow_smt=flags["allow_smt"])

    @classmethod
    def load(cls, path: Path) -> TdxPolicy:
        try:
            return cls.from_json(loads_untrusted(path.read_bytes(), max_bytes=1024 * 1024,
                                                 depth=4, what=f"TDX policy {path}",
                                                 unique_keys=True))
        except (OSError, UntrustedJsonError) as e:
            raise ValueError(f"cannot read TDX policy {path}: {e}") from e


def _list(v: Any, what: str) -> list[Any]:
    if not isinstance(v, list):
        raise ValueError(f"{what} must be a list")
    return v


def _str_set(v: Any, what: str) -> frozenset[str]:
    items = _list(v, what)
    if not all(isinstance(x, str) for x in items):
        raise ValueError(f"{what} must be a list of strings")
    return frozenset(items)


def _hex_n(v: Any, n: int, what: str) -> bytes:
    # policies and measurements are written as bare hex (``bytes.hex()``); 0x is accepted too
    try:
        return parse_hex_lenient(v, n, what)
    except HexFormatError:
        raise ValueError(f"{what} must be {n} bytes of hex, got {v!r:.100}") from None


# ---- verification -------------------------------------------------------------------------
@dataclass(frozen=True)
class TdxVerification:
    tcb_status: str
    advisory_ids: tuple[str, ...]
    mrtd: bytes
    rtmr0: bytes
    rtmr1: bytes
    rtmr2: bytes
    rtmr3: bytes
    report_data: bytes
    td_attributes: bytes
    fmspc: str
    measurement: bytes | None  # from the replayed log; None when it names no verinfer image
    collateral_expires_at: int  # the earliest nextUpdate/notAfter in the collateral

    def to_json(self) -> dict[str, Any]:
        return {"ok": True, "tee": TEE, "tcb_status": self.tcb_status,
                "advisory_ids": list(self.advisory_ids), "mrtd": self.mrtd.hex(),
                "rtmr0": self.rtmr0.hex(), "rtmr1": self.rtmr1.hex(), "rtmr2": self.rtmr2.hex(),
                "rtmr3": self.rtmr3.hex(), "report_data": self.report_data.hex(),
                "td_attributes": self.td_attributes.hex(), "fmspc": self.fmspc,
                "measurement": None if self.measurement is None else self.measurement.hex(),
                "collateral_expires_at": self.collateral_expires_at}


_COLLATERAL_KEYS = ("pck_crl_issuer_chain", "root_ca_crl", "pck_crl", "tcb_info_issuer_chain",
                    "tcb_info", "tcb_info_signature", "qe_identity_issuer_chain", "qe_identity",
                    "qe_identity_signature")


def _root_der(pem: bytes) -> bytes:
    from cryptography import x509
    from cryptography.hazmat.primitives.serialization import Encoding

    return x509.load_pem_x509_certificate(pem).public_bytes(Encoding.DER)


_INTEL_ROOT_DER = _root_der(INTEL_SGX_ROOT_CA_PEM)
if hashlib.sha256(_INTEL_ROOT_DER).hexdigest() != INTEL_SGX_ROOT_CA_SHA256:  # pragma: no cover
    raise RuntimeError("the pinned Intel SGX Root CA does not match its fingerprint")


def verify_tdx(evidence: TdxEvidence, *, now: int, policy: TdxPolicy,
               root_ca_der: bytes = _INTEL_ROOT_DER) -> TdxVerification:
    """All checks of the module doc, in order; raises the first refusal (an
    ``AttestationError`` subclass), never anything else for any input bytes."""
    import dcap_qvl

    # 1. the quote itself
    try:
        parsed = dcap_qvl.parse_quote(evidence.quote)
    except (ValueError, TypeError) as e:
        raise QuoteMalformedError(f"TDX quote does not parse: {_first_line(e)}") from e
    if not parsed.is_tdx():
        raise QuoteNotTdxError(f"quote is a {parsed.quote_type()} quote, not TDX")
    try:
        fmspc = parsed.fmspc().upper()
    except ValueError as e:
        raise QuoteMalformedError(f"no FMSPC in the quote's PCK certificate: {e}") from e
    # 2. collateral: shape, TEE, platform, dates (before the signatures, for named reasons;
    # these only ever refuse, dcap-qvl then authenticates every byte)
    coll_text, expires_at = _check_collateral(evidence.collateral, fmspc, now)
    try:
        collateral = dcap_qvl.QuoteCollateralV3.from_json(coll_text)
    except (ValueError, TypeError) as e:
        raise CollateralMalformedError(f"collateral rejected by dcap-qvl: {_first_line(e)}") \
            from e
    # 3. Intel's signatures, chains, CRLs, TCB level
    qp = (dcap_qvl.QuotePolicy.strict(now)
          .allow_dynamic_platform(policy.allow_dynamic_platform)
          .allow_cached_keys(policy.allow_cached_keys).allow_smt(policy.allow_smt))
    for s in TCB_STATUSES:  # our own step 4 decides, with a named reason
        qp = qp.allow_status(s)
    if policy.min_tcb_eval_data_number is not None:
        qp = qp.min_tcb_eval_data_number(policy.min_tcb_eval_data_number)
    try:
        claims_json = dcap_qvl.QuoteVerifier(root_ca_der).verify_with_policy(
            evidence.quote, collateral, now, qp).to_json()
    except (ValueError, TypeError) as e:
        raise _map_dcap_error(e) from e
    claims = json.loads(claims_json)  # the library's own output, ~5 KB, fixed shape
    tcb = claims.get("tcb") or {}
    status = str(tcb.get("status"))
    advisories = tuple(str(a) for a in tcb.get("advisory_ids") or ())
    report = _td_report(claims.get("report"))
    signed = TdxVerification(
        tcb_status=status, advisory_ids=advisories, mrtd=report["mr_td"],
        rtmr0=report["rt_mr0"], rtmr1=report["rt_mr1"], rtmr2=report["rt_mr2"],
        rtmr3=report["rt_mr3"], report_data=report["report_data"],
        td_attributes=report["td_attributes"], fmspc=fmspc, measurement=None,
        collateral_expires_at=expires_at)
    return apply_policy(signed, evidence.event_log, policy)


def apply_policy(v: TdxVerification, event_log: Sequence[tuple[str, bytes]],
                 policy: TdxPolicy) -> TdxVerification:
    """Steps 4-9 on the fields of a quote whose signatures step 3 verified (split out so that
    each rule is testable on real verified values: no debug TD quote signed by Intel exists
    for this repository to test with)."""
    # 4. TCB status and advisories
    if v.tcb_status not in policy.accepted_tcb_statuses:
        raise TcbStatusNotAcceptedError(
            f"TCB status {v.tcb_status} is not accepted (accepted: "
            f"{sorted(policy.accepted_tcb_statuses)})")
    unlisted = [a for a in v.advisory_ids if a not in policy.accepted_advisory_ids]
    if unlisted:
        raise AdvisoryNotAcceptedError(f"advisories {unlisted} are not accepted by the policy")
    # 5. debug: TD attributes byte 0 is TUD ("TD under debug"), bit 0 DEBUG; bits 1-7 are
    # reserved-must-be-zero. A debug TD's memory and registers are readable by the host.
    if len(v.td_attributes) != 8 or v.td_attributes[0] != 0:
        raise TdDebugError(f"TD attributes {v.td_attributes.hex()} have TUD bits set: a debug "
                           "TD is readable by its host")
    # 6. platform allow-list
    if policy.platforms is not None:
        by_mrtd = [p for p in policy.platforms if p.mrtd == v.mrtd]
        if not by_mrtd:
            raise MrtdNotAllowedError(f"MRTD {v.mrtd.hex()} is not allow-listed")
        if not any((p.rtmr0, p.rtmr1, p.rtmr2) == (v.rtmr0, v.rtmr1, v.rtmr2) for p in by_mrtd):
            raise RtmrNotAllowedError(
                "RTMR0-2 (firmware config, kernel, command line) match no allow-listed "
                f"platform with MRTD {v.mrtd.hex()[:16]}…")
    # 7. RTMR3 replay
    replayed = replay_rtmr3(event_log)
    if replayed != v.rtmr3:
        raise Rtmr3MismatchError(
            f"event log ({len(event_log)} events) replays to {replayed.hex()[:16]}…, "
            f"the quote's RTMR3 is {v.rtmr3.hex()[:16]}…")
    # 8. the measurement, only from the replayed log
    meas = measurement_from_events(event_log, policy.extra_event_names)
    if policy.measurements is not None:
        if meas is None:
            raise EventLogIncompleteError(
                f"RTMR3 log lacks one of {list(REQUIRED_EVENTS)}: no image is attested")
        if meas not in policy.measurements:
            raise MeasurementNotAllowedError(f"measurement 0x{meas.hex()} is not allowlisted")
    # 9. report_data
    if policy.expected_report_data is not None and v.report_data != policy.expected_report_data:
        raise TdxReportDataMismatchError(
            f"quote report_data {v.report_data.hex()[:16]}… is not the expected binding "
            f"{policy.expected_report_data.hex()[:16]}…")
    return replace(v, measurement=meas)


def _first_line(e: BaseException) -> str:
    return str(e).split("\n", 1)[0][:300]


def _td_report(report: Any) -> dict[str, bytes]:
    body = None
    if isinstance(report, Mapping):
        for kind in ("TD10", "TD15", "TD15Ex"):
            if isinstance(report.get(kind), Mapping):
                body = report[kind]
                break
    if body is None:
        raise QuoteNotTdxError("verified quote carries no TD report")
    out = {}
    for k, n in (("td_attributes", 8), ("mr_td", 48), ("rt_mr0", 48), ("rt_mr1", 48),
                 ("rt_mr2", 48), ("rt_mr3", 48), ("report_data", REPORT_DATA_LEN)):
        try:
            out[k] = _hex_n(body.get(k), n, k)
        except ValueError as e:
            raise QuoteMalformedError(f"TD report field {k}: {e}") from e
    return out


#: dcap-qvl refusal texts (first line, lower-cased) -> our error; the first match wins, so
#: the narrower phrases come first. Anything unmatched is ``quote_verification_failed``.
_DCAP_ERRORS: tuple[tuple[str, type[AttestationError]], ...] = (
    ("revoked", PckRevokedError),
    ("expired", CollateralExpiredError),
    ("in the future", CollateralNotYetValidError),
    ("not allowed by policy", TcbPlatformRefusedError),
    ("eval", TcbPlatformRefusedError),
    ("for tcb_info in quote_collateral", CollateralSignatureError),
    ("for qe_identity in quote_collateral", CollateralSignatureError),
    ("root ca crl", CollateralSignatureError),
    ("unsupported qe identity", CollateralMismatchError),
    ("fmspc", CollateralMismatchError),
    ("no tcb level", CollateralMismatchError),
    ("failed to decode quote", QuoteMalformedError),
    ("unsupported dcap", QuoteMalformedError),
    ("failed to extract pck", QuoteMalformedError),
    ("failed to parse pck", QuoteMalformedError),
    ("signature", QuoteSignatureError),
    ("hash mismatch", QuoteSignatureError),
    ("certificate chain", QuoteSignatureError),
    ("unknown qe vendor", QuoteSignatureError),
)


def _map_dcap_error(e: BaseException) -> AttestationError:
    text = _first_line(e).removeprefix("Verification failed: ")
    low = str(e).lower()  # the cause chain names e.g. UnknownRevocationStatus
    head = text.lower()
    for phrase, cls in _DCAP_ERRORS:
        if phrase in head:
            return cls(f"dcap-qvl: {text}")
    if "revocation" in low:
        return QuoteSignatureError(f"dcap-qvl: {text} (revocation status unknown)")
    return QuoteVerificationFailedError(f"dcap-qvl: {text}")


def _parse_time(v: Any, what: str) -> int:
    if not isinstance(v, str):
        raise CollateralMalformedError(f"{what} must be an ISO 8601 time, got {v!r:.60}")
    try:
        t = datetime.fromisoformat(v.replace("Z", "+00:00"))
    except ValueError as e:
        raise CollateralMalformedError(f"{what} is not an ISO 8601 time: {v!r:.60}") from e
    if t.tzinfo is None:
        raise CollateralMalformedError(f"{what} has no time zone: {v!r:.60}")
    return int(t.timestamp())


def _check_collateral(raw: bytes, fmspc: str, now: int) -> tuple[str, int]:
    """Shape, TEE type and platform of the collateral and every date in it; returns the text
    for dcap-qvl and the earliest expiry. Refusals name the item."""
    from cryptography import x509

    try:
        d = loads_untrusted(raw, max_bytes=MAX_COLLATERAL_BYTES, depth=4, what="TDX collateral",
                            unique_keys=True)
    except UntrustedJsonError as e:
        raise CollateralMalformedError(e.message) from e
    if not isinstance(d, dict) or any(not isinstance(d.get(k), str) for k in _COLLATERAL_KEYS):
        raise CollateralMalformedError(
            f"collateral must be an object with string fields {list(_COLLATERAL_KEYS)}")
    windows: list[tuple[str, int, int]] = []  # (item, valid from, valid until)
    for item, want_id in (("tcb_info", "TDX"), ("qe_identity", "TD_QE")):
        try:
            body = loads_untrusted(d[item], max_bytes=MAX_COLLATERAL_BYTES, depth=8,
                                   what=f"collateral {item}", unique_keys=True)
        except UntrustedJsonError as e:
            raise CollateralMalformedError(e.message) from e
        if not isinstance(body, dict):
            raise CollateralMalformedError(f"collateral {item} must be a JSON object")
        if body.get("id") != want_id:
            raise CollateralMismatchError(
                f"collateral {item} is for {body.get('id')!r:.20}, a TDX quote needs {want_id}")
        if item == "tcb_info" and str(body.get("fmspc", "")).upper() != fmspc:
            raise CollateralMismatchError(
                f"TCB info is for FMSPC {body.get('fmspc')!r:.20}, the quote's platform is "
                f"{fmspc}")
        windows.append((item, _parse_time(body.get("issueDate"), f"{item}.issueDate"),
                        _parse_time(body.get("nextUpdate"), f"{item}.nextUpdate")))
    for item in ("root_ca_crl", "pck_crl"):
        try:
            crl = x509.load_der_x509_crl(parse_hex_lenient(d[item], None, f"collateral {item}"))
        except ValueError as e:  # HexFormatError is one (a non-string too)
            raise CollateralMalformedError(f"collateral {item} is not a DER CRL in hex") from e
        if crl.next_update_utc is None:
            raise CollateralMalformedError(f"collateral {item} has no nextUpdate")
        windows.append((item, int(crl.last_update_utc.timestamp()),
                        int(crl.next_update_utc.timestamp())))
    for item in ("pck_crl_issuer_chain", "tcb_info_issuer_chain", "qe_identity_issuer_chain"):
        try:
            certs = x509.load_pem_x509_certificates(d[item].encode())
        except ValueError as e:
            raise CollateralMalformedError(f"collateral {item} is not a PEM chain") from e
        for i, c in enumerate(certs):
            windows.append((f"{item}[{i}]", int(c.not_valid_before_utc.timestamp()),
                            int(c.not_valid_after_utc.timestamp())))
    for item, start, end in windows:
        if now < start:
            raise CollateralNotYetValidError(
                f"{item} is valid from {start}, now is {now}: the clock or the collateral is "
                "wrong")
        if now >= end:
            raise CollateralExpiredError(f"{item} expired at {end} (now {now}): refresh the "
                                         "collateral from Intel PCS / a PCCS")
    return raw.decode("utf-8"), min(end for _, _, end in windows)


class TdxQuoteVerifier:
    """``QuoteVerifier`` for Intel TDX evidence (``Quote(tee="tdx", raw=TdxEvidence...)``).

    The shard's ``AttestationPolicy`` supplies ``now`` and the allowed verinfer measurements
    (the same allow-list as the software enclave: one entry = one image); the ``TdxPolicy``
    given here supplies TCB statuses, advisories, platform flags and the platform
    (MRTD/RTMR0-2) allow-list, which must not be empty. report_data is returned for the
    caller to compare with the request binding (the KMS protocol's ``report_data``).
    """

    tee = TEE

    def __init__(self, policy: TdxPolicy, *, root_ca_der: bytes = _INTEL_ROOT_DER) -> None:
        if not policy.platforms:
            raise ValueError("a TDX verifier needs a non-empty platform allow-list "
                             "(MRTD, RTMR0-2): without one any TD image would pass")
        self.policy = policy
        self._root = root_ca_der
        self.root_id = hashlib.sha256(root_ca_der).digest()

    def verify(self, quote: Quote, policy: AttestationPolicy) -> VerifiedQuote:
        if quote.tee != TEE:
            raise UnsupportedTeeError(f"TDX verifier got a {quote.tee!r} quote")
        now = int(policy.now())
        evidence = TdxEvidence.decode(quote.raw)
        v = verify_tdx(evidence, now=now, root_ca_der=self._root,
                       policy=replace(self.policy, measurements=policy.allowed_measurements,
                                      expected_report_data=None))
        assert v.measurement is not None  # measurements were checked
        # TDX quotes carry no time: freshness rests on the shard's nonce in report_data.
        return VerifiedQuote(TEE, v.measurement, v.report_data, now, self.root_id)


# ---- attester (inside a TD) ---------------------------------------------------------------
#: Linux configfs-tsm report interface and the tdx-guest driver's RTMR3 extension file.
TSM_REPORT_ROOT = Path("/sys/kernel/config/tsm/report")
RTMR3_EXTEND_PATH = Path("/sys/class/misc/tdx_guest/measurements/rtmr3:sha384")


class TsmError(AttestationError):
    """This guest could not produce a quote (configfs-tsm); the attester's own failure."""

    code = "tsm_failed"


@dataclass
class TdxAttester:
    """Obtains TDX quotes through Linux configfs-tsm and keeps the RTMR3 event log it extended.

    THIS CANNOT RUN HERE: it needs a TDX guest kernel (``/sys/kernel/config/tsm/report`` with
    provider ``tdx_guest``) and nothing in this repository's CI is one. Its unit test drives
    the file protocol against a temporary directory to test our I/O code only; it is no
    evidence that TDX works. ``collateral_for(quote)`` returns the collateral JSON for the
    quote's platform (from a PCCS cache or Intel PCS), which travels with the quote.

    configfs-tsm protocol: mkdir an entry, check ``provider``, write the 64-byte report_data
    to ``inblob``, read ``outblob`` (the kernel generates the quote), and read ``generation``
    before and after: a different value means another writer used the entry in between, and
    the quote may be for its inblob, so it is refused.
    """

    collateral_for: Callable[[bytes], bytes]
    tsm_root: Path = TSM_REPORT_ROOT
    rtmr3_path: Path = RTMR3_EXTEND_PATH
    mkdir: Callable[[Path], None] = field(default=os.mkdir)
    event_log: list[tuple[str, bytes]] = field(default_factory=list)
    tee: str = TEE

    def extend(self, name: str, payload: bytes) -> None:
        """Extend RTMR3 with one event and remember it (the log is sent with every quote)."""
        if not 0 < len(name.encode()) <= MAX_EVENT_NAME or len(payload) > MAX_EVENT_PAYLOAD:
            raise TsmError(f"event {name!r:.80} out of bounds")
        if len(self.event_log) >= MAX_EVENTS:
            raise TsmError(f"event log full ({MAX_EVENTS})")
        try:
            with open(self.rtmr3_path, "wb", buffering=0) as f:
                f.write(event_digest(name, payload))
        except OSError as e:
            raise TsmError(f"cannot extend RTMR3 via {self.rtmr3_path}: {e}") from e
        self.event_log.append((name, payload))

    def quote(self, report_data: bytes) -> Quote:
        if len(report_data) != REPORT_DATA_LEN:
            raise QuoteMalformedError(f"report_data must be {REPORT_DATA_LEN} bytes")
        entry = self.tsm_root / f"verinfer-{uuid.uuid4().hex}"
        try:
            self.mkdir(entry)
            provider = (entry / "provider").read_text().strip()
            if provider != "tdx_guest":
                raise TsmError(f"configfs-tsm provider is {provider!r}, not tdx_guest")
            (entry / "inblob").write_bytes(report_data)
            before = (entry / "generation").read_text().strip()
            raw = (entry / "outblob").read_bytes()
            after = (entry / "generation").read_text().strip()
        except OSError as e:
            raise TsmError(f"configfs-tsm report via {entry} failed: {e}") from e
        finally:
            with contextlib.suppress(OSError):  # absent when mkdir failed
                os.rmdir(entry)  # configfs removes the attribute files with the entry
        if before != after:
            raise TsmError(f"configfs-tsm entry changed generation ({before} -> {after}) while "
                           "reading: another writer raced us")
        if not raw or len(raw) > MAX_QUOTE_BYTES:
            raise TsmError(f"configfs-tsm returned a {len(raw)}-byte quote")
        evidence = TdxEvidence(raw, self.collateral_for(raw), tuple(self.event_log))
        return Quote(TEE, evidence.encode())
