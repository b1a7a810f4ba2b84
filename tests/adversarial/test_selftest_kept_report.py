"""Attack: skip the determinism self-test with a kept report that does not belong to this
engine (issue 18). A passed report is reused only when it is readable, of this report version,
passed, and names this engine's approved fingerprint hash; anything else makes the gate run the
self-test again before signing. (The operator who fakes one harms itself — an unproven backend
can make honest answers slashable — but a copied or stale file must never open the gate.)"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from verinfer.engine.engine import Engine
from verinfer.engine.selftest import SelfTestReport, run_selftest
from verinfer.operator.readiness import Readiness
from verinfer.operator.runtime import SelfTestGate


@pytest.fixture(scope="module")
def passed(tiny_engine: Engine) -> SelfTestReport:
    return run_selftest(tiny_engine, batch_sizes=(2,))


def _gate(engine: Engine, state: Path, runs: list[Any], passed: SelfTestReport) -> Readiness:
    readiness = Readiness()

    def run(eng: Engine) -> SelfTestReport:
        runs.append(eng)
        return passed

    gate = SelfTestGate(readiness, [engine], state, run=run).start()
    assert gate.thread is not None
    gate.thread.join(60)
    engine.fingerprint.reported.pop("selftest", None)  # the session engine's /health facts
    return readiness


@pytest.mark.parametrize("forgery", ["other_fingerprint", "failed_marked_passed_elsewhere",
                                     "garbage", "future_version"])
def test_a_report_not_for_this_fingerprint_is_not_reused(tiny_engine: Engine, tmp_path: Path,
                                                         passed: SelfTestReport,
                                                         forgery: str) -> None:
    path = tmp_path / "selftest" / f"{tiny_engine.fingerprint.hash.hex()}.json"
    path.parent.mkdir(parents=True)
    doc = passed.to_json()
    if forgery == "other_fingerprint":  # copied from a machine where it passed
        doc["fingerprint_hash"] = "0x" + "ab" * 32
        path.write_text(json.dumps(doc))
    elif forgery == "failed_marked_passed_elsewhere":
        failed = dataclasses.replace(passed, passed=False, first_failure="x: y")
        path.write_text(json.dumps(failed.to_json()))
    elif forgery == "garbage":
        path.write_text("{not json")
    else:
        doc["version"] = 99
        path.write_text(json.dumps(doc))
    runs: list[Any] = []
    readiness = _gate(tiny_engine, tmp_path, runs, passed)
    assert len(runs) == 1  # the self-test ran again
    assert readiness.ready
    kept = json.loads(path.read_text())
    assert kept["fingerprint_hash"] == "0x" + tiny_engine.fingerprint.hash.hex()


def test_the_matching_passed_report_is_reused(tiny_engine: Engine, tmp_path: Path,
                                              passed: SelfTestReport) -> None:
    passed.save(tmp_path / "selftest" / f"{tiny_engine.fingerprint.hash.hex()}.json")
    runs: list[Any] = []
    assert _gate(tiny_engine, tmp_path, runs, passed).ready and runs == []
