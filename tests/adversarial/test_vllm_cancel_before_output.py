"""A client sends a long prompt to a vLLM-backed operator and hangs up at once.

The attack: the operator cancels a request whose client left (``Engine.cancel``), but the vLLM
backend only aborted a cancelled request when vLLM next gave an output for it — and a prompt
still being prefilled gives none until its first token; a request cancelled before it reached
vLLM was added all the same. So every abandoned request still cost its whole prefill (up to
the protocol's 131,072-token context) on the backend's one stepping thread. Who gains: a
griefer slowing every other client, paying only for sending bytes.

Fix (vllm_backend/engine.py ``_loop``): a request cancelled before it reached vLLM is never
added, and cancelled ones are aborted before every step, output or not. The stepping loop
runs here against a recording stand-in for vLLM that never finishes a prefill (no output),
so no vLLM is needed.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future
from types import SimpleNamespace
from typing import Any

from verinfer.engine.engine import Engine, GenerationResult
from verinfer.engine.vllm_backend.engine import VllmEngine, _Req
from verinfer.engine.vllm_backend.logits_hook import TRACKS, Track
from verinfer.protocol.sampling_params import SamplingParams


class PrefillForever:
    """vLLM as seen by the backend, every request stuck in its prefill: no output ever."""

    def __init__(self) -> None:
        self.added: list[str] = []
        self.aborted: list[str] = []
        self.steps = 0

    def add_request(self, key: str, _prompt: Any, _params: Any) -> None:
        self.added.append(key)

    def abort_request(self, keys: list[str]) -> None:
        self.aborted.extend(keys)

    def step(self) -> list[Any]:
        self.steps += 1
        time.sleep(0.001)
        return []


def _backend(tiny_engine: Engine, llm: PrefillForever) -> Any:
    eng: Any = object.__new__(VllmEngine)
    eng.tokenizer = tiny_engine.tokenizer
    eng.settings = SimpleNamespace(threads=1)
    eng._set_threads = lambda _n: None
    eng._vllm_params = lambda _req: None
    eng._llm = llm
    eng._cv = threading.Condition()
    eng._incoming, eng._live, eng._closed = [], {}, False
    return eng


def _req(key: str) -> _Req:
    params = SamplingParams(max_tokens=4)
    track = Track(params, None, 3)
    TRACKS.add(key, track)
    fut: Future[GenerationResult] = Future()
    return _Req(key, [1, 2, 3], params, fut, track, None, None)


def _until(cond: Any, what: str) -> None:
    deadline = time.monotonic() + 10
    while not cond():
        assert time.monotonic() < deadline, what
        time.sleep(0.005)


def test_a_cancelled_request_costs_no_prefill(tiny_engine: Engine) -> None:
    llm = PrefillForever()
    eng = _backend(tiny_engine, llm)
    early, mid = _req("cancel-early"), _req("cancel-mid")
    kept = [_req("kept-1"), _req("kept-2")]
    early.future.cancel()  # the client left while the request waited for the loop
    eng._incoming += [early, mid, *kept]
    worker = threading.Thread(target=eng._loop, daemon=True)
    worker.start()
    try:
        _until(lambda: "cancel-mid" in llm.added, "the live request reached vLLM")
        assert "cancel-early" not in llm.added  # unfixed: added, and its prefill run
        mid.future.cancel()  # the client left during the prefill
        steps = llm.steps
        _until(lambda: "cancel-mid" in llm.aborted or llm.steps > steps + 50,
               "the loop kept stepping")
        assert llm.aborted == ["cancel-mid"]  # unfixed: never, as no output ever comes
        assert set(eng._live) == {"kept-1", "kept-2"} and TRACKS.get("cancel-mid") is None
        assert not any(k.future.done() for k in kept)
    finally:
        with eng._cv:
            eng._closed = True
            eng._cv.notify()
        worker.join(timeout=10)
    assert not worker.is_alive()
    # every request still in flight is failed at close (a loop over the dict it shrinks
    # raised at the first and left the others waiting for ever)
    for k in kept:
        assert "engine closed" in str(k.future.exception(timeout=0))


def test_close_fails_every_request_in_flight(tiny_engine: Engine) -> None:
    """The backend's close failed the first request in flight, then raised (the loop iterated
    the dict it took each out of): the worker died and the others waited for ever (a
    ``generate`` caller blocked, a server's shutdown hung on it)."""
    llm = PrefillForever()
    eng = _backend(tiny_engine, llm)
    live = [_req(f"closing-{i}") for i in range(3)]
    eng._incoming += live
    worker = threading.Thread(target=eng._loop, daemon=True)
    worker.start()
    _until(lambda: len(llm.added) == 3, "the requests reached vLLM")
    with eng._cv:
        eng._closed = True
        eng._cv.notify()
    worker.join(timeout=10)
    for r in live:
        assert "engine closed" in str(r.future.exception(timeout=1))
