"""A client makes the vLLM backend copy its whole output text after every token.

The attack: a non-streamed request with a long ``max_tokens`` (and stop strings that never
match). The vLLM backend read ``StopState.text`` after every token although only a stream's
step event and the final result need it; each read joins the whole output so far, so a request
of ``n`` tokens copied O(n^2) characters (at the protocol's 131,072-token context, tens of GB
of copying on the backend's one stepping thread, which every other request waits on). Who
gains: a griefer slowing every request sharing the engine, at the price of one long request.

Fix (vllm_backend/engine.py ``_take``): the text is built only for an ``on_step`` consumer and
at the finish, as the own engine does (engine/stop_rule.py: "the whole text built only when
read"). Measured as work, not time: how many times the whole text is built for one request.
The backend's stepping is driven here with a recorded track (what the logits hook writes), so
no vLLM is needed.
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import Future
from typing import Any

import pytest

from verinfer.engine.engine import Engine, GenerationResult, StepEvent
from verinfer.engine.stop_rule import StopState, stop_rule
from verinfer.engine.vllm_backend.engine import VllmEngine, _Req
from verinfer.engine.vllm_backend.logits_hook import TRACKS, StepRecord, Track
from verinfer.protocol.sampling_params import SamplingParams

N = 120


@pytest.fixture
def text_reads(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """Counts every build of a StopState's whole text."""
    reads = [0]
    real = StopState.text

    def counted(self: StopState) -> str:
        reads[0] += 1
        return real.fget(self)  # type: ignore[attr-defined]

    monkeypatch.setattr(StopState, "text", property(counted))
    yield reads


def _backend(tiny_engine: Engine) -> Any:
    """The vLLM backend's bookkeeping (no vLLM behind it: ``_take`` is fed by hand)."""
    eng: Any = object.__new__(VllmEngine)
    eng.tokenizer = tiny_engine.tokenizer
    eng._live = {}
    return eng


def _run(tiny_engine: Engine, key: str, on_step: Any) -> tuple[GenerationResult, list[int]]:
    tok = tiny_engine.tokenizer
    prompt = tok.encode("the whole text once per request")
    params = SamplingParams(max_tokens=N, ignore_eos=True, stop=("\x00\x01never",))
    ids = [t for t in range(tok.vocab_size) if not tok.is_special(t)][:N]
    track = Track(params, None, len(prompt))
    for i, t in enumerate(ids):
        track.steps[len(prompt) + i] = StepRecord(t, bytes(32), None)
    fut: Future[GenerationResult] = Future()
    req = _Req(key, list(prompt), params, fut, track, None, on_step)
    TRACKS.add(key, track)
    eng = _backend(tiny_engine)
    for n in range(1, N + 1):  # vLLM's cumulative outputs, one more token each step
        eng._take(req, ids[:n], n == N)
    return fut.result(timeout=0), ids


def test_vllm_backend_builds_a_whole_request_text_once(
        tiny_engine: Engine, text_reads: list[int]) -> None:
    res, ids = _run(tiny_engine, "cost-whole", None)
    assert res.token_ids == ids and res.finish_reason == "length"
    assert (res.finish_reason, res.text) == stop_rule(tiny_engine.tokenizer, ids, SamplingParams(
        max_tokens=N, ignore_eos=True, stop=("\x00\x01never",)))
    assert text_reads[0] <= 2, f"{text_reads[0]} whole-text builds for {N} tokens"


def test_vllm_backend_stream_still_gets_the_text_every_step(
        tiny_engine: Engine, text_reads: list[int]) -> None:
    events: list[StepEvent] = []
    res, ids = _run(tiny_engine, "cost-stream", events.append)
    assert [e.token_id for e in events] == ids
    tok = tiny_engine.tokenizer
    assert all(e.text == tok.decode(ids[:i + 1]) for i, e in enumerate(events))
    assert res.text == events[-1].text
