"""Engine.cancel: a cancelled request is dropped before the scheduler's next step (no further
token, no on_step, its KV cache released), its future raises CancelledError, and the requests
beside it are untouched, bit for bit."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from concurrent.futures import CancelledError

import pytest

from verinfer.engine.engine import Engine, StepEvent
from verinfer.engine.loader import LoadedModel
from verinfer.protocol.sampling_params import SamplingParams

LONG = SamplingParams(max_tokens=300, temperature=0.9, seed=5, ignore_eos=True)
OTHER = SamplingParams(max_tokens=60, temperature=0.9, seed=6, ignore_eos=True)


@pytest.fixture
def engine(tiny_loaded: LoadedModel) -> Iterator[Engine]:
    eng = Engine(tiny_loaded, "invariant", max_seqs=2, max_batch_tokens=48)
    yield eng
    eng.close()


def _wait(pred: object, what: str) -> None:
    deadline = time.monotonic() + 30
    while not pred():  # type: ignore[operator]
        assert time.monotonic() < deadline, what
        time.sleep(0.001)


def test_cancel_running_and_waiting(engine: Engine) -> None:
    prompt = engine.tokenizer.encode("cancel me")
    alone = engine.generate(prompt, OTHER)
    steps: list[int] = []
    running = engine.submit(prompt, LONG, on_step=lambda ev: steps.append(ev.index))
    other = engine.submit(prompt, OTHER)
    waiting = engine.submit(prompt, LONG)  # max_seqs=2: queued behind the two
    _wait(lambda: len(steps) >= 5, "the long request did not start")
    assert engine.cancel(waiting) and engine.cancel(running)
    with pytest.raises(CancelledError):
        running.result()
    with pytest.raises(CancelledError):
        waiting.result()
    n = len(steps)
    got = other.result(timeout=60)
    # the one beside them ran to its end with the bits it has alone
    assert (got.token_ids, got.step_digests, got.text) == (
        alone.token_ids, alone.step_digests, alone.text)
    _wait(lambda: engine.in_flight == 0, "the cancelled requests were not dropped")
    assert len(steps) <= n + 1  # at most the step already under way when cancel came
    assert len(steps) < LONG.max_tokens
    assert not engine.cancel(other)  # finished: nothing to cancel


def test_cancel_during_a_step_does_not_fail_the_others(engine: Engine) -> None:
    """A future cancelled while the engine thread is inside the step that completes it (here:
    from the on_step callback, on that thread, just before the result is set) used to raise
    InvalidStateError in the step, which failed every other request of that step."""
    prompt = engine.tokenizer.encode("race")
    last: dict[str, object] = {}
    assigned = threading.Event()
    short = SamplingParams(max_tokens=4, temperature=0.9, seed=1, ignore_eos=True)

    def on_step(ev: StepEvent) -> None:
        if ev.finished is not None:  # the step that is about to set its result
            assigned.wait(30)
            fut = last["fut"]
            assert fut.cancel()  # type: ignore[attr-defined]

    gate = threading.Event()
    other = engine.submit(prompt, LONG, on_step=lambda ev: gate.set())
    gate.wait(30)
    fut = engine.submit(prompt, short, on_step=on_step)
    last["fut"] = fut
    assigned.set()
    with pytest.raises(CancelledError):
        fut.result(timeout=30)
    res = other.result(timeout=60)  # not failed by the cancelled one's step
    assert len(res.token_ids) == LONG.max_tokens
    # and the engine still serves
    assert len(engine.generate(prompt, short).token_ids) == 4
