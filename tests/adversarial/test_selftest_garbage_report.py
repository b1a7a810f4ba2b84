"""Garbage in the kept self-test report (a truncated write, a hand edit, a file copied from a
tool that writes other JSON): the gate must run the self-test again, never stay shut for an
hour because the file crashed the loader, and never open because a string reads as true."""

from __future__ import annotations

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


@pytest.mark.parametrize("garbage", ["[]", '"a string"', "null", "7", "passed-as-string",
                                     "cases-not-objects"])
def test_a_kept_report_that_is_no_report_makes_the_self_test_run_again(
        tiny_engine: Engine, tmp_path: Path, passed: SelfTestReport, garbage: str) -> None:
    """``load_report`` called ``doc.get`` on whatever JSON the file held: a list, string,
    number or null raised AttributeError, which the gate reads as "the self-test could not
    run" and blocks signing for an hour (retry_after 3600 s) instead of running it. And a
    report whose ``passed`` is the string "false" was truthy: reused as a pass. Who gains:
    nobody on purpose (the file is the operator's own state); what it costs: an operator
    whose state file got corrupted stops serving for an hour, or signs under a backend that
    failed. Now anything but a well-typed report is no report: the self-test runs."""
    path = tmp_path / "selftest" / f"{tiny_engine.fingerprint.hash.hex()}.json"
    path.parent.mkdir(parents=True)
    doc = passed.to_json()
    if garbage == "passed-as-string":
        path.write_text(json.dumps({**doc, "passed": "false"}))
    elif garbage == "cases-not-objects":
        path.write_text(json.dumps({**doc, "cases": [1, 2]}))
    else:
        path.write_text(garbage)
    runs: list[Any] = []

    def run(eng: Engine) -> SelfTestReport:
        runs.append(eng)
        return passed

    readiness = Readiness()
    gate = SelfTestGate(readiness, [tiny_engine], tmp_path, run=run).start()
    assert gate.thread is not None
    gate.thread.join(60)
    tiny_engine.fingerprint.reported.pop("selftest", None)  # the session engine's facts
    assert len(runs) == 1, garbage  # the self-test ran again
    assert readiness.ready, readiness
