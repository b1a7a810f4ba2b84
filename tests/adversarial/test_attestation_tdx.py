"""Attacks on TDX attestation, on the real public sample (tests/vectors/attestation): every
refusal has its own reason code, and no input crashes the verifier (a shard runs it on
requester bytes). Also: a shard configured for TDX only refuses software-enclave quotes, and
one configured for both releases to a software quote only with the insecure flag."""

from __future__ import annotations

import datetime
import random
from dataclasses import replace
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
from eth_account import Account
from fastapi.testclient import TestClient

from verinfer.attestation.errors import AttestationError
from verinfer.attestation.quotes import AttestationPolicy, Quote, measurement
from verinfer.attestation.software import SoftwareAttester, SoftwareQuoteVerifier, load_root_private
from verinfer.attestation.tdx import (
    EVENT_IMAGE_DIGEST,
    TdxEvidence,
    TdxPlatform,
    TdxPolicy,
    TdxQuoteVerifier,
    TdxVerification,
    apply_policy,
    verify_tdx,
    verinfer_events,
)
from verinfer.attestation.tee_gate import TeeGate, build_tee_gate
from verinfer.kms.identity import sign_eip191
from verinfer.kms.local_cluster import build_shard_service, provision
from verinfer.kms.protocol import ReleaseRequest, report_data, requester_digest
from verinfer.kms.shard import ShardService
from verinfer.kms.shard_app import create_app

V = Path(__file__).resolve().parents[1] / "vectors" / "attestation"
NOW = 1750334400
QUOTE = (V / "tdx_quote").read_bytes()
COLL = (V / "tdx_quote_collateral.json").read_bytes()
SGX_QUOTE = (V / "sgx_quote").read_bytes()
SGX_COLL = (V / "sgx_quote_collateral.json").read_bytes()
SAMPLE = TdxEvidence(QUOTE, COLL)
# the quote's layout (Intel TDX DCAP quote v4): header 48 + TD report 584 = the signed region;
# u32 signature data length; ECDSA signature 64; attestation key 64; cert data type/size 6;
# QE report 384 + its signature 64 (signed by the PCK key)
SIGNED = range(0, 632)
QUOTE_SIG = range(636, 700)
QE_REPORT_AND_SIG = range(770, 770 + 384 + 64)


def refusal(ev: TdxEvidence, *, now: int = NOW, policy: TdxPolicy | None = None) -> str:
    try:
        verify_tdx(ev, now=now, policy=policy or TdxPolicy())
    except AttestationError as e:
        return e.code
    return "accepted"


@pytest.fixture(scope="module")
def verified() -> TdxVerification:
    return verify_tdx(SAMPLE, now=NOW, policy=TdxPolicy())


def test_every_flipped_byte_of_the_signed_region_and_signatures_is_refused() -> None:
    seen: dict[str, int] = {}
    for off in [*SIGNED, *QUOTE_SIG, *QE_REPORT_AND_SIG]:
        b = bytearray(QUOTE)
        b[off] ^= 0x01
        code = refusal(replace(SAMPLE, quote=bytes(b)))
        assert code != "accepted", f"flip at byte {off} accepted"
        seen[code] = seen.get(code, 0) + 1
    # header fields that steer parsing are malformed or not-TDX; the rest breaks a signature
    assert set(seen) <= {"quote_signature_invalid", "quote_malformed", "quote_not_tdx"}, seen
    assert seen["quote_signature_invalid"] > 1000


def test_truncated_quotes_are_malformed() -> None:
    for n in (0, 1, 47, 48, 631, 632, 700, 1500, 4000):
        assert refusal(replace(SAMPLE, quote=QUOTE[:n])) == "quote_malformed", n


def test_collateral_of_another_platform_is_a_mismatch() -> None:
    assert refusal(replace(SAMPLE, collateral=SGX_COLL)) == "collateral_mismatch"


def test_sgx_sample_offered_as_tdx() -> None:
    assert refusal(TdxEvidence(SGX_QUOTE, SGX_COLL)) == "quote_not_tdx"


def test_collateral_window() -> None:
    assert refusal(SAMPLE, now=1750329147) == "accepted"  # the newest item's issue time
    assert refusal(SAMPLE, now=1750329146) == "collateral_not_yet_valid"
    assert refusal(SAMPLE, now=1752919234) == "accepted"
    assert refusal(SAMPLE, now=1752919235) == "collateral_expired"  # PCK CRL nextUpdate
    assert refusal(SAMPLE, now=1753000000) == "collateral_expired"


def test_tampered_or_malformed_collateral() -> None:
    text = COLL.decode()
    assert refusal(replace(SAMPLE, collateral=text.replace("UpToDate", "OutOfDate", 1).encode())) \
        == "collateral_signature_invalid"
    assert refusal(replace(SAMPLE, collateral=b"{}")) == "collateral_malformed"
    assert refusal(replace(SAMPLE, collateral=b"[" * 10_000)) == "collateral_malformed"


def test_a_quote_chaining_to_another_root_is_refused() -> None:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(x509.NameOID.COMMON_NAME, "Intel SGX Root CA")])
    t = datetime.datetime(2018, 1, 1, tzinfo=datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
            .public_key(key.public_key()).serial_number(1).not_valid_before(t)
            .not_valid_after(t.replace(year=2049))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    der = cert.public_bytes(serialization.Encoding.DER)
    with pytest.raises(AttestationError) as e:
        verify_tdx(SAMPLE, now=NOW, policy=TdxPolicy(), root_ca_der=der)
    # the first thing that must verify under the pinned root is the root CA's own CRL
    assert e.value.code == "collateral_signature_invalid", e.value.message


def test_platform_allow_list(verified: TdxVerification) -> None:
    good = TdxPlatform(verified.mrtd, verified.rtmr0, verified.rtmr1, verified.rtmr2)
    other_mrtd = replace(good, mrtd=b"\x11" * 48)
    assert refusal(SAMPLE, policy=TdxPolicy(platforms=frozenset({other_mrtd}))) \
        == "mrtd_not_allowed"
    other_kernel = replace(good, rtmr1=b"\x22" * 48)  # same firmware, another kernel
    assert refusal(SAMPLE, policy=TdxPolicy(platforms=frozenset({other_kernel}))) \
        == "rtmr_not_allowed"
    assert refusal(SAMPLE, policy=TdxPolicy(platforms=frozenset({good}))) == "accepted"


def test_rtmr3_event_log_that_does_not_replay() -> None:
    # the sample's RTMR3 is zero: any claimed image is a lie about this TD
    lying = replace(SAMPLE, event_log=verinfer_events("sha256:" + "ab" * 32, "c", "fp"))
    assert refusal(lying) == "rtmr3_mismatch"
    # the honest (empty) log replays but attests no verinfer image
    assert refusal(SAMPLE, policy=TdxPolicy(measurements=frozenset({b"\0" * 32}))) \
        == "event_log_incomplete"


def test_report_data_not_the_kms_request_binding() -> None:
    """The real sample necessarily lands here: its report_data was made by Phala for its own
    purposes, so it can never equal a verinfer KMS request binding."""
    rd = report_data(epoch=1, purpose="full_challenge", challenge_id="7",
                     requester="0x" + "ab" * 20, enclave_public_key=b"\x01" * 32,
                     nonces={1: b"\x02" * 32})
    assert refusal(SAMPLE, policy=TdxPolicy(expected_report_data=rd)) == "report_data_mismatch"


def test_debug_td_tcb_status_and_advisories(verified: TdxVerification) -> None:
    """No Intel-signed debug-TD quote exists to test with, so the rule runs on the sample's
    verified fields with the DEBUG bit set; in the raw quote that bit is signed (above: any
    flip there is quote_signature_invalid), so it cannot be cleared by a requester."""
    debug = replace(verified, td_attributes=bytes([0x01]) + verified.td_attributes[1:])
    with pytest.raises(AttestationError) as e:
        apply_policy(debug, (), TdxPolicy())
    assert e.value.code == "td_debug"
    with pytest.raises(AttestationError) as e:
        apply_policy(verified, (), TdxPolicy(accepted_tcb_statuses=frozenset({"OutOfDate"})))
    assert e.value.code == "tcb_status_not_accepted"
    advised = replace(verified, advisory_ids=("INTEL-SA-00615",))
    with pytest.raises(AttestationError) as e:
        apply_policy(advised, (), TdxPolicy())
    assert e.value.code == "advisory_not_accepted"
    ok = apply_policy(advised, (), TdxPolicy(accepted_advisory_ids=frozenset({"INTEL-SA-00615"})))
    assert ok.advisory_ids == ("INTEL-SA-00615",)


def test_random_mutations_never_crash() -> None:
    rng = random.Random(16)
    raw = replace(SAMPLE, event_log=((EVENT_IMAGE_DIGEST, b"x"),)).encode()
    verifier = TdxQuoteVerifier(TdxPolicy(platforms=frozenset({TdxPlatform(*[b"\0" * 48] * 4)})))
    pol = AttestationPolicy(allowed_measurements=frozenset(), max_age_s=60, now=lambda: NOW)
    for _ in range(300):
        b = bytearray(raw)
        for _ in range(rng.randint(1, 4)):
            b[rng.randrange(len(b))] = rng.randrange(256)
        cut = rng.choice([len(b), rng.randrange(len(b) + 1)])
        with pytest.raises(AttestationError):
            verifier.verify(Quote("tdx", bytes(b[:cut])), pol)


# ---- the shard's TEE gate -----------------------------------------------------------------
M = measurement("sha256:" + "11" * 32, "code", "engine")
T0 = 1_700_000_000.0


def shard_with(tmp_path: Path, gate: TeeGate, now: float = T0) -> tuple[TestClient, object]:
    member = Account.create()
    lay = provision(tmp_path / "kms", epoch=1, threshold=2, shares=3, measurements=[M],
                    verifiers=[member.address], challenges={"c1": [member.address]},
                    now=lambda: now, unsafe_single_tree=True)
    base = build_shard_service(lay, 1, now=lambda: now)
    service = ShardService(replace(base.cfg, quote_verifier=gate))
    return TestClient(create_app(service)), (lay, member)


def release_body(client: TestClient, lay: object, member: object,
                 quote_for: object) -> dict[str, object]:
    n = bytes.fromhex(client.post("/v1/nonce").json()["nonce"][2:])
    pub = X25519PrivateKey.generate().public_key().public_bytes_raw()
    nonces = {1: n, 2: b"\x02" * 32}
    requester = member.address.lower()  # type: ignore[attr-defined]
    rd = report_data(epoch=1, purpose="full_challenge", challenge_id="c1", requester=requester,
                     enclave_public_key=pub, nonces=nonces)
    req = ReleaseRequest(epoch=1, purpose="full_challenge", challenge_id="c1",
                         requester=requester,
                         requester_signature=sign_eip191(member, requester_digest(rd)),  # type: ignore[arg-type]
                         enclave_public_key=pub, nonces=nonces,
                         quote=quote_for(rd))  # type: ignore[operator]
    return req.to_json()


def tdx_gate(verified_sample: TdxVerification) -> TdxQuoteVerifier:
    v = verified_sample
    return TdxQuoteVerifier(TdxPolicy(platforms=frozenset({TdxPlatform(v.mrtd, v.rtmr0,
                                                                       v.rtmr1, v.rtmr2)})))


def test_tdx_only_shard_refuses_software_quotes(tmp_path: Path,
                                                verified: TdxVerification) -> None:
    gate = TeeGate([tdx_gate(verified)], accepted=frozenset({"tdx"}))
    client, (lay, member) = shard_with(tmp_path, gate)  # type: ignore[misc]
    att = SoftwareAttester(load_root_private(lay.root_key), M, lambda: T0)
    r = client.post("/v1/release", json=release_body(client, lay, member, att.quote))
    assert r.status_code == 403 and r.json()["error"]["reason"] == "tee_not_accepted", r.text
    assert client.get("/health").json()["insecure_software_enclave"] is False
    assert "kms_insecure_software_enclave 0.0" in client.get("/metrics").text


def test_tdx_shard_refuses_the_real_sample(tmp_path: Path, verified: TdxVerification) -> None:
    """On the shard path the genuine sample is refused: its RTMR3 attests no verinfer image
    (event_log_incomplete), and its report_data could never bind this request anyway."""
    gate = TeeGate([tdx_gate(verified)], accepted=frozenset({"tdx"}))
    client, (lay, member) = shard_with(tmp_path, gate, now=NOW)  # type: ignore[misc]
    body = release_body(client, lay, member, lambda rd: Quote("tdx", SAMPLE.encode()))
    r = client.post("/v1/release", json=body)
    assert r.status_code == 403 and r.json()["error"]["reason"] == "event_log_incomplete", r.text


def test_software_quotes_only_with_the_insecure_flag(tmp_path: Path,
                                                     verified: TdxVerification) -> None:
    with pytest.raises(ValueError, match="allow-insecure-software-enclave"):
        TeeGate([tdx_gate(verified), SoftwareQuoteVerifier()],
                accepted=frozenset({"tdx", "software"}))
    with pytest.raises(ValueError, match="no TEE accepted"):
        build_tee_gate(tees=[], tdx_policy=None, allow_insecure_software_enclave=False)
    gate = TeeGate([tdx_gate(verified), SoftwareQuoteVerifier()],
                   accepted=frozenset({"tdx", "software"}), per_epoch={2: frozenset({"tdx"})},
                   allow_insecure_software_enclave=True)
    assert gate.accepted(2) == {"tdx"} and gate.accepted(1) == {"tdx", "software"}
    client, (lay, member) = shard_with(tmp_path, gate)  # type: ignore[misc]
    att = SoftwareAttester(load_root_private(lay.root_key), M, lambda: T0)
    r = client.post("/v1/release", json=release_body(client, lay, member, att.quote))
    assert r.status_code == 200, r.text
    assert client.get("/health").json()["insecure_software_enclave"] is True
    assert "kms_insecure_software_enclave 1.0" in client.get("/metrics").text
