"""The determinism self-test (issue 18) on the own engine (the tiny model) and on a backend
double whose logits change with the batch: the own engine passes every case and may replay;
the batch-variant backend fails, the report names the first differing case, and the operator's
gate then refuses to sign. Passed reports are kept per fingerprint and reused."""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pytest

from verinfer.engine.engine import Engine, GenerationResult
from verinfer.engine.selftest import (
    SelfTestFailedError,
    load_report,
    require_pass,
    run_selftest,
)
from verinfer.operator.readiness import Readiness
from verinfer.operator.runtime import SelfTestGate
from verinfer.protocol.sampling_params import SamplingParams


class BatchVariantBackend:
    """A test double of a backend whose kernels are not batch invariant: a request that
    shares the engine with another one gets other logits bits (one digest byte flipped), as
    a split-K GEMM or a batch-dependent attention kernel would give."""

    def __init__(self, inner: Engine) -> None:
        self.inner = inner
        self.tokenizer, self.model_id = inner.tokenizer, inner.model_id
        # its own copy: the gate writes the self-test summary into ``reported``
        self.fingerprint = dataclasses.replace(inner.fingerprint,
                                               reported=dict(inner.fingerprint.reported))
        self._lock = threading.Lock()
        self._in_flight = 0

    def generate(self, prompt_ids: Sequence[int], params: SamplingParams, *,
                 top_logprobs: int | None = None) -> GenerationResult:
        return self.submit(prompt_ids, params, top_logprobs=top_logprobs).result()

    def submit(self, prompt_ids: Sequence[int], params: SamplingParams, *,
               top_logprobs: int | None = None, **_: Any) -> Future[GenerationResult]:
        with self._lock:
            shared = self._in_flight > 0
            self._in_flight += 1
        out: Future[GenerationResult] = Future()

        def done(f: Future[GenerationResult]) -> None:
            with self._lock:
                self._in_flight -= 1
            res = f.result()
            if shared:
                first = bytes([res.step_digests[0][0] ^ 1]) + res.step_digests[0][1:]
                res = dataclasses.replace(res, step_digests=[first, *res.step_digests[1:]])
            out.set_result(res)

        self.inner.submit(prompt_ids, params, top_logprobs=top_logprobs).add_done_callback(done)
        return out

    def replay(self, *a: Any, **kw: Any) -> Any:
        return self.inner.replay(*a, **kw)


@pytest.fixture(scope="module")
def own_report(tiny_engine: Engine) -> Any:
    return run_selftest(tiny_engine)


def test_own_engine_passes_every_case_and_may_replay(own_report: Any) -> None:
    assert own_report.passed and own_report.first_failure is None, own_report.first_failure
    names = [c.name for c in own_report.cases]
    assert any("/greedy/batch8@" in n for n in names)
    assert any("/seeded/batch4@" in n for n in names)
    assert sum(n.endswith("/replay") for n in names) == 6  # 3 prompts x greedy/seeded
    assert own_report.replay_reproduces_decode and own_report.verification == "replay"
    assert own_report.backend == "torch-cpu"
    require_pass(own_report)  # no error


def test_batch_variant_backend_fails_and_names_the_first_case(tiny_engine: Engine) -> None:
    report = run_selftest(BatchVariantBackend(tiny_engine))  # type: ignore[arg-type]
    assert not report.passed
    assert report.first_failure is not None
    assert "/batch4@" in report.first_failure and "logits bits differ at step 0" in \
        report.first_failure
    # alone, the double is deterministic: only the batched cases fail
    assert all(c.passed for c in report.cases if "alone" in c.name)
    with pytest.raises(SelfTestFailedError, match="must not sign"):
        require_pass(report)


def test_gate_refuses_to_sign_until_passed_then_reuses_the_kept_report(
        tiny_engine: Engine, tmp_path: Path, own_report: Any) -> None:
    readiness = Readiness()
    release = threading.Event()
    runs = []

    def slow_run(eng: Engine) -> Any:
        runs.append(eng)
        release.wait(30)
        return own_report

    try:
        _gate_round_trip(tiny_engine, tmp_path, own_report, readiness, release, runs, slow_run)
    finally:  # the session's engine: leave its /health facts as they were
        tiny_engine.fingerprint.reported.pop("selftest", None)


def _gate_round_trip(tiny_engine: Engine, tmp_path: Path, own_report: Any,
                     readiness: Readiness, release: threading.Event, runs: list[Any],
                     slow_run: Any) -> None:
    gate = SelfTestGate(readiness, [tiny_engine], tmp_path, run=slow_run).start()
    assert not readiness.ready and "running" in readiness.reasons()["selftest"]
    release.set()
    assert gate.thread is not None
    gate.thread.join(30)
    assert readiness.ready and len(runs) == 1
    kept = gate.report_path(tiny_engine)
    assert kept.name == tiny_engine.fingerprint.hash.hex() + ".json"
    assert load_report(kept) == own_report
    assert tiny_engine.fingerprint.reported["selftest"]["passed"] is True
    # a restart under the same fingerprint reuses the passed report instead of re-running
    again = SelfTestGate(Readiness(), [tiny_engine], tmp_path, run=slow_run).start()
    assert again.thread is not None
    again.thread.join(30)
    assert again.readiness.ready and len(runs) == 1


def test_gate_keeps_refusing_after_a_failed_selftest(tiny_engine: Engine,
                                                     tmp_path: Path) -> None:
    readiness = Readiness()
    double = BatchVariantBackend(tiny_engine)
    gate = SelfTestGate(readiness, [double], tmp_path).start()  # type: ignore[list-item]
    assert gate.thread is not None
    gate.thread.join(300)
    reason = readiness.reasons().get("selftest", "")
    assert "failed the determinism self-test" in reason and "batch4" in reason
    # the failed report is kept too (for the operator to read), and never reused as a pass
    assert not load_report(gate.report_path(double)).passed  # type: ignore[arg-type,union-attr]
    gate2 = SelfTestGate(Readiness(), [double], tmp_path).start()  # type: ignore[list-item]
    assert gate2.thread is not None
    gate2.thread.join(300)
    assert "selftest" in gate2.readiness.reasons()
