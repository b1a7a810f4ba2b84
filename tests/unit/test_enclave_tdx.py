"""TDX quote verification on the real public sample (tests/vectors/attestation, Phala's
dcap-qvl repository): what verifies, the evidence framing, the RTMR3 event log, the policy
file, the CLI, and the configfs-tsm attester's file I/O."""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path

import pytest
from typer.testing import CliRunner

from verinfer.attestation.errors import QuoteMalformedError
from verinfer.attestation.quotes import measurement
from verinfer.attestation.tdx import (
    EVENT_IMAGE_DIGEST,
    MAX_EVENTS,
    EventLogUnexpectedEventError,
    TdxAttester,
    TdxEvidence,
    TdxPlatform,
    TdxPolicy,
    TsmError,
    event_digest,
    measurement_from_events,
    replay_rtmr3,
    verify_tdx,
    verinfer_events,
)
from verinfer.enclave.cli import app as enclave_app

V = Path(__file__).resolve().parents[1] / "vectors" / "attestation"
NOW = 1750334400  # 2025-06-19T12:00Z: inside the sample collateral's window
MRTD = ("91eb2b44d141d4ece09f0c75c2c53d247a3c68edd7fafe8a3520c942a604a407"
        "de03ae6dc5f87f27428b2538873118b7")


@pytest.fixture(scope="module")
def sample() -> TdxEvidence:
    return TdxEvidence((V / "tdx_quote").read_bytes(),
                       (V / "tdx_quote_collateral.json").read_bytes())


def test_real_sample_verifies_at_the_pinned_time(sample: TdxEvidence) -> None:
    v = verify_tdx(sample, now=NOW, policy=TdxPolicy())
    assert v.tcb_status == "UpToDate" and v.advisory_ids == ()
    assert v.mrtd.hex() == MRTD
    assert v.rtmr3 == bytes(48)  # the replay of an empty log
    assert v.td_attributes[0] == 0  # not a debug TD
    assert v.report_data.hex().startswith("9a9d48e7f6799642")
    assert v.fmspc == "B0C06F000000"
    assert v.measurement is None  # no verinfer image in RTMR3
    assert v.collateral_expires_at == 1752919235  # the PCK CRL's nextUpdate


def test_allow_listed_platform_passes(sample: TdxEvidence) -> None:
    v = verify_tdx(sample, now=NOW, policy=TdxPolicy())
    plat = TdxPlatform(v.mrtd, v.rtmr0, v.rtmr1, v.rtmr2)
    pol = TdxPolicy.from_json({"platforms": [plat.to_json()]})
    assert verify_tdx(sample, now=NOW, policy=pol).mrtd == v.mrtd


def test_evidence_framing_round_trip_and_bounds(sample: TdxEvidence) -> None:
    ev = replace(sample, event_log=verinfer_events("sha256:" + "ab" * 32, "code", "fp"))
    raw = ev.encode()
    assert TdxEvidence.decode(raw) == ev
    for bad in (raw[:-1], raw + b"\0", b"VTDX2" + raw[5:], raw[:3], b""):
        with pytest.raises(QuoteMalformedError):
            TdxEvidence.decode(bad)
    huge = b"VTDX1" + (2**31).to_bytes(4, "big")  # a length far over the bound, no allocation
    with pytest.raises(QuoteMalformedError, match="exceeds"):
        TdxEvidence.decode(huge)
    too_many = TdxEvidence(b"q", b"c", tuple(("x", b"") for _ in range(MAX_EVENTS + 1)))
    with pytest.raises(QuoteMalformedError, match="events"):
        TdxEvidence.decode(too_many.encode())


def test_rtmr3_replay_and_measurement() -> None:
    events = verinfer_events("sha256:" + "cd" * 32, "code-1", "fp-1")
    r = bytes(48)
    import hashlib
    for name, payload in events:
        r = hashlib.sha384(r + event_digest(name, payload)).digest()
    assert replay_rtmr3(events) == r != bytes(48)
    assert replay_rtmr3(events[::-1]) != r  # order is measured
    assert measurement_from_events(events) == measurement("sha256:" + "cd" * 32, "code-1", "fp-1")
    assert measurement_from_events(events[:2]) is None  # no engine fingerprint: no image
    with pytest.raises(EventLogUnexpectedEventError, match="twice"):
        measurement_from_events([*events, (EVENT_IMAGE_DIGEST, b"sha256:other")])
    with pytest.raises(EventLogUnexpectedEventError, match="not one the policy knows"):
        measurement_from_events([*events, ("debug-shell", b"on")])
    assert measurement_from_events([*events, ("app.boot", b"1")],
                                   frozenset({"app.boot"})) is not None


def test_policy_file_refuses_what_would_loosen_it() -> None:
    for bad in ({"accepted_tcb_statuses": ["Revoked"]}, {"accepted_tcb_status": ["UpToDate"]},
                {"platforms": [{"mrtd": "00"}]}, {"allow_smt": "yes"},
                {"measurements": ["0x12"]}, []):
        with pytest.raises(ValueError):
            TdxPolicy.from_json(bad)
    assert TdxPolicy.from_json({}).accepted_tcb_statuses == {"UpToDate"}


def run_cli(*args: str) -> tuple[int, dict[str, object]]:
    res = CliRunner().invoke(enclave_app, ["verify-quote", *args])
    return res.exit_code, json.loads(res.output.strip().splitlines()[-1])


def test_cli_verify_quote(tmp_path: Path) -> None:
    q, c = str(V / "tdx_quote"), str(V / "tdx_quote_collateral.json")
    code, out = run_cli("--quote", q, "--collateral", c, "--now", str(NOW))
    assert code == 0, out
    assert out["ok"] is True and out["tee"] == "tdx" and out["tcb_status"] == "UpToDate"
    assert out["mrtd"] == MRTD and out["rtmr3"] == "00" * 48 and out["measurement"] is None
    assert {"advisory_ids", "rtmr0", "rtmr1", "rtmr2", "report_data"} <= set(out)
    # refused: after the collateral expired, non-zero exit and a reason
    code, out = run_cli("--quote", q, "--collateral", c, "--now", "1753000000")
    assert code == 1 and out == {**out, "ok": False, "reason": "collateral_expired"}
    # with a policy naming another MRTD
    pol = tmp_path / "policy.json"
    pol.write_text(json.dumps({"platforms": [{"mrtd": "11" * 48, "rtmr0": "00" * 48,
                                              "rtmr1": "00" * 48, "rtmr2": "00" * 48}]}))
    code, out = run_cli("--quote", q, "--collateral", c, "--now", str(NOW), "--policy", str(pol))
    assert code == 1 and out["reason"] == "mrtd_not_allowed"
    # with an event log that does not replay to RTMR3
    log = tmp_path / "log.json"
    log.write_text(json.dumps([{"name": EVENT_IMAGE_DIGEST, "payload": "sha256:" + "00" * 32}]))
    code, out = run_cli("--quote", q, "--collateral", c, "--now", str(NOW), "--event-log",
                        str(log))
    assert code == 1 and out["reason"] == "rtmr3_mismatch"


# ---- the attester: file I/O only. It cannot run here (no TDX guest); this tests our code's
# use of the configfs-tsm file protocol against a temporary directory, nothing about TDX.
def fake_tsm_mkdir(quote: bytes, *, provider: str = "tdx_guest"):  # type: ignore[no-untyped-def]
    def mkdir(entry: Path) -> None:  # what the kernel creates with the entry
        os.mkdir(entry)
        (entry / "provider").write_text(provider + "\n")
        (entry / "generation").write_text("1\n")
        (entry / "outblob").write_bytes(quote)
    return mkdir


def test_attester_file_protocol(tmp_path: Path, sample: TdxEvidence) -> None:
    rtmr = tmp_path / "rtmr3"
    att = TdxAttester(collateral_for=lambda q: sample.collateral, tsm_root=tmp_path,
                      rtmr3_path=rtmr, mkdir=fake_tsm_mkdir(sample.quote))
    att.extend(EVENT_IMAGE_DIGEST, b"sha256:" + b"ab" * 32)
    assert rtmr.read_bytes() == event_digest(EVENT_IMAGE_DIGEST, b"sha256:" + b"ab" * 32)
    rd = bytes(range(64))
    q = att.quote(rd)
    assert q.tee == "tdx"
    ev = TdxEvidence.decode(q.raw)
    assert ev.quote == sample.quote and ev.collateral == sample.collateral
    assert ev.event_log == ((EVENT_IMAGE_DIGEST, b"sha256:" + b"ab" * 32),)
    (entry,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    assert (entry / "inblob").read_bytes() == rd  # the report_data went in
    with pytest.raises(QuoteMalformedError):
        att.quote(b"short")
    bad = replace(att, mkdir=fake_tsm_mkdir(sample.quote, provider="sev_guest"))
    with pytest.raises(TsmError, match="provider"):
        bad.quote(rd)
    missing = replace(att, tsm_root=tmp_path / "absent")
    with pytest.raises(TsmError):
        missing.quote(rd)
