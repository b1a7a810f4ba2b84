"""A client that hangs up mid-stream no longer keeps its job running to max_tokens.

The attack: open many long streamed requests and disconnect after the first chunk; each job
used to run on to ``max_tokens`` (the operator's compute, and a batch slot every other request
waits behind), though no receipt is issued for a stream that never reaches its final chunk.
Now the serving layer cancels the jobs of a stream that is closed before its end
(``Engine.cancel``) and the scheduler drops them at its next step.

Real HTTP: the operator app (with its evidence pipeline, so receipts are really issued) under
uvicorn on loopback in this process, httpx as the client; the engine is this test's own, so
its running set can be watched.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn

from verinfer.da_client.outbox import Outbox
from verinfer.engine.engine import Engine
from verinfer.engine.loader import LoadedModel
from verinfer.operator.app import ServerConfig, create_app
from verinfer.operator.evidence import EvidencePipeline
from verinfer.ports import free_port
from verinfer.receipts.eip712 import Domain, ReceiptSigner
from verinfer.receipts.epoch_keys import derive_epoch_keypair

DOMAIN = Domain(31337, "0x5FbDB2315678afecb367f032d93F642f64180aa3")
_, EPOCH_PK = derive_epoch_keypair(hashlib.sha256(b"disconnect epoch").digest())
LONG = 1800  # max_tokens of the requests: long enough that the tiny model runs them all out


@dataclass
class Operator:
    base: str
    engine: Engine
    outbox: Outbox


@pytest.fixture(scope="module")
def operator(tiny_loaded: LoadedModel, tmp_path_factory: pytest.TempPathFactory
             ) -> Iterator[Operator]:
    engine = Engine(tiny_loaded, "invariant", max_seqs=4, max_batch_tokens=48)
    # The tiny model runs a whole LONG answer in under 0.3 s on a quiet machine, faster than
    # the clients below hang up: pace each forward pass by 1 ms so a whole answer takes >= 1.8 s
    # on any machine (the bits are unchanged; only the wall time between steps grows).
    step = engine._step

    def paced_step(running: list[Any]) -> None:
        time.sleep(0.001)
        step(running)

    engine._step = paced_step  # type: ignore[method-assign]
    outbox = Outbox(Path(tmp_path_factory.mktemp("outbox")) / "outbox.db")
    evidence = EvidencePipeline(engine, ReceiptSigner(hashlib.sha256(b"op").digest()), DOMAIN,
                                1, EPOCH_PK, outbox, "local")
    app = create_app(engine, "tiny", ServerConfig(evidence=evidence))
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port,
                                           log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.02)
    yield Operator(f"http://127.0.0.1:{port}", engine, outbox)
    server.should_exit = True
    thread.join(timeout=30)
    engine.close()


def _body(seed: int, *, stream: bool) -> dict[str, object]:
    return {"model": "tiny", "max_tokens": LONG, "temperature": 0.9, "seed": seed,
            "stream": stream, "messages": [{"role": "user", "content": "tell me a story"}]}


def _wait(pred: object, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not pred():  # type: ignore[operator]
        assert time.monotonic() < deadline, what
        time.sleep(0.002)


def _full_stream(base: str, body: dict[str, object], out: dict[str, object]) -> None:
    """Reads a whole stream (another client's request, running beside the one that hangs up)."""
    chunks = []
    with httpx.Client(base_url=base, timeout=120) as c, \
            c.stream("POST", "/v1/chat/completions", json=body) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                chunks.append(json.loads(line[6:]))
    out["chunks"] = chunks


def test_hang_up_mid_stream_frees_the_engine(operator: Operator) -> None:
    eng = operator.engine
    assert eng.in_flight == 0
    published_before = operator.outbox.pending_count()
    # the request that stays: a long stream read to its end by another client
    other: dict[str, object] = {}
    t = threading.Thread(target=_full_stream, args=(operator.base, _body(8, stream=True), other))
    t.start()
    _wait(lambda: eng.in_flight == 1, 30, "the other request did not start")
    # the one that hangs up after a few chunks
    with httpx.Client(base_url=operator.base, timeout=60) as c, \
            c.stream("POST", "/v1/chat/completions", json=_body(3, stream=True)) as r:
        assert r.status_code == 200
        seen = 0
        for line in r.iter_lines():
            seen += line.startswith("data: ")
            if seen >= 5:
                break
        assert eng.in_flight == 2  # both running
        steps_at_hang_up = eng.steps
    # leaving the block closed the connection mid-stream
    _wait(lambda: eng.in_flight <= 1, 30, "the abandoned job was never dropped")
    dropped_after = eng.steps - steps_at_hang_up
    assert t.is_alive() or eng.in_flight == 0
    t.join(timeout=120)
    assert not t.is_alive()
    # the other request is whole: LONG tokens (it ran on), a final chunk with its receipt
    chunks: list[dict[str, object]] = other["chunks"]  # type: ignore[assignment]
    final = chunks[-1]
    assert "verification" in final, final
    finish = [c for c in chunks if c["choices"] and c["choices"][0].get("finish_reason")]
    ids = finish[0]["choices"][0]["verinfer"]["output_token_ids"]
    assert len(ids) == LONG
    # the abandoned job left within a few steps, far from its LONG tokens
    assert dropped_after <= 40, dropped_after
    _wait(lambda: eng.in_flight == 0, 30, "the engine did not go idle")
    # one receipt issued: the finished stream's; none for the abandoned one
    assert operator.outbox.pending_count() - published_before == 1
    # the other's tokens are those of the same request run alone (the cancellation touched
    # no bit of it), and the abandoned request, run to its end, would have taken LONG tokens
    with httpx.Client(base_url=operator.base, timeout=120) as c:
        alone = c.post("/v1/chat/completions", json=_body(8, stream=False)).json()
        assert alone["choices"][0]["verinfer"]["output_token_ids"] == ids
        whole = c.post("/v1/chat/completions", json=_body(3, stream=False)).json()
        assert len(whole["choices"][0]["verinfer"]["output_token_ids"]) == LONG


def test_hang_up_before_a_whole_answer_frees_the_engine(operator: Operator) -> None:
    """The same for a non-streamed request: the client gives up (read timeout) while the answer
    is generated; its job is dropped and no receipt is issued (it used to run on to LONG tokens
    and publish a receipt nobody would receive)."""
    eng = operator.engine
    _wait(lambda: eng.in_flight == 0, 30, "the engine is not idle")
    published_before = operator.outbox.pending_count()
    steps_before = eng.steps
    with httpx.Client(base_url=operator.base, timeout=httpx.Timeout(60, read=0.3)) as c, \
            pytest.raises(httpx.ReadTimeout):
        c.post("/v1/chat/completions", json=_body(3, stream=False))
    steps_at_hang_up = eng.steps
    assert steps_at_hang_up > steps_before  # it was running when the client left
    _wait(lambda: eng.in_flight == 0, 30, "the abandoned job was never dropped")
    # dropped before its end (a whole answer is LONG steps): how many steps ran before the
    # server saw the hang-up depends on the machine's load (1,091 of 1,800 once, with the
    # image builds beside it), so the bound is the whole answer, not a share of it
    assert eng.steps - steps_before < LONG, eng.steps - steps_before
    time.sleep(0.2)  # a receipt, if any, would be written right after the job
    assert operator.outbox.pending_count() == published_before
    # the server still answers, and a whole answer still gets its receipt
    with httpx.Client(base_url=operator.base, timeout=120) as c:
        r = c.post("/v1/chat/completions", json={**_body(5, stream=False), "max_tokens": 8})
        assert r.status_code == 200 and "verification" in r.json()
    assert operator.outbox.pending_count() == published_before + 1
