"""Issue 14 item 6: logprobs are committed (ExecRequest.top_logprobs, ExecResult.logprobs) and
checked by re-execution. Each test is one attack by an operator on the logprobs it returns,
carried out with the real library (seal, sign) and judged by the real verifier job on the real
tiny engine; each must end in a vote against the operator's outHash.
"""

from __future__ import annotations

import hashlib
import json
import struct
from dataclasses import replace
from pathlib import Path

import pytest

from verinfer.chain.structs import INVALID_EVIDENCE
from verinfer.engine.engine import Engine
from verinfer.protocol.exec_request import ExecRequest
from verinfer.receipts.canonical import ExecResult
from verinfer.receipts.eip712 import Domain, ReceiptSigner
from verinfer.receipts.epoch_keys import EnvelopeSuite, derive_epoch_keypair
from verinfer.testing.evidence import Evidence, EvidenceFactory, request_for_body
from verinfer.verifier.reexec import judge, verify_receipt_job

SIGNER = ReceiptSigner(hashlib.sha256(b"logprobs adversary").digest())
DOMAIN = Domain(31337, "0x5FbDB2315678afecb367f032d93F642f64180aa3")
SK, PK = derive_epoch_keypair(hashlib.sha256(b"logprobs epoch").digest(), EnvelopeSuite.X25519)

# sampled (not greedy), so the chosen token is often not the most likely one: its logprob is
# worth lying about ("the model was sure")
BODY = json.dumps({"model": "tiny", "messages": [{"role": "user", "content": "rate this"}],
                   "max_tokens": 6, "temperature": 0.9, "seed": 11, "logprobs": True,
                   "top_logprobs": 3}, separators=(",", ":")).encode()


@pytest.fixture(scope="module")
def factory(tiny_engine: Engine) -> EvidenceFactory:
    return EvidenceFactory(tiny_engine, SIGNER, DOMAIN, key_epoch=5, epoch_public_key=PK,
                           now=lambda: 1_800_000_000)


@pytest.fixture(scope="module")
def honest(tiny_engine: Engine) -> tuple[ExecRequest, ExecResult, str]:
    req = request_for_body(tiny_engine, BODY)
    assert req.top_logprobs == 3  # the request rule puts what was asked into req_hash
    gen = tiny_engine.generate(list(req.prompt_token_ids), req.sampling_params(),
                               top_logprobs=req.top_logprobs)
    res = ExecResult.from_generation(gen)
    assert res.logprobs is not None and len(res.logprobs) == len(res.output_token_ids)
    return req, res, gen.text


def _flip_last_bit(x: float) -> float:
    (w,) = struct.unpack(">Q", struct.pack(">d", x))
    return struct.unpack(">d", struct.pack(">Q", w ^ 1))[0]


def _cheat(factory: EvidenceFactory, request: ExecRequest, result: ExecResult,
           text: str) -> Evidence:
    """What a cheating operator publishes: a consistent envelope and a valid signature over
    the result it chose (the API showed the client exactly these logprobs)."""
    return factory._finish(BODY, request, result, text)


def test_honest_logprobs_are_confirmed_by_one_replay(tiny_engine: Engine,
                                                     factory: EvidenceFactory) -> None:
    ev = factory.honest(BODY)
    v = judge(tiny_engine, ev.signed.receipt, ev.blob, SK)
    assert v.reason == "match" and v.agrees
    assert v.decoded_tokens == 0  # logprobs come from the replay's logits, no decode needed


def test_one_bit_of_one_alternative_is_caught(tiny_path: Path, factory: EvidenceFactory,
                                              honest: tuple[ExecRequest, ExecResult, str]
                                              ) -> None:
    req, res, text = honest
    assert res.logprobs is not None
    lp, top = res.logprobs[-1]
    (tid, val), *rest = top
    forged = replace(res, logprobs=(*res.logprobs[:-1],
                                    (lp, ((tid, _flip_last_bit(val)), *rest))))
    ev = _cheat(factory, req, forged, text)
    # the real enclave job entry point (loads its own engine from the model file)
    out = verify_receipt_job(SK, receipt=ev.signed.receipt.to_json(), blob=ev.blob,
                             model_path=str(tiny_path))
    assert out["reason"] == "output_mismatch" and out["agrees"] is False
    assert out["vote"] == "0x" + res.hash.hex()  # the committee votes the honest outHash
    assert out["detail"] == "same tokens, different logprobs"


def test_inflated_confidence_in_the_sampled_token_is_caught(
        tiny_engine: Engine, factory: EvidenceFactory,
        honest: tuple[ExecRequest, ExecResult, str]) -> None:
    req, res, text = honest
    assert res.logprobs is not None
    # claim the model was nearly certain of every token it produced
    forged = replace(res, logprobs=tuple((-1e-6, top) for _, top in res.logprobs))
    ev = _cheat(factory, req, forged, text)
    v = judge(tiny_engine, ev.signed.receipt, ev.blob, SK)
    assert v.reason == "output_mismatch" and not v.agrees and v.vote == res.hash


def test_reordered_or_swapped_alternatives_are_caught(
        tiny_engine: Engine, factory: EvidenceFactory,
        honest: tuple[ExecRequest, ExecResult, str]) -> None:
    req, res, text = honest
    assert res.logprobs is not None
    lp, top = res.logprobs[0]
    swapped = ((top[1][0], top[0][1]), (top[0][0], top[1][1]), *top[2:])  # ids trade places
    forged = replace(res, logprobs=((lp, swapped), *res.logprobs[1:]))
    ev = _cheat(factory, req, forged, text)
    v = judge(tiny_engine, ev.signed.receipt, ev.blob, SK)
    assert v.reason == "output_mismatch" and v.vote == res.hash


def test_skipping_the_logprobs_work_is_caught(tiny_engine: Engine, factory: EvidenceFactory,
                                              honest: tuple[ExecRequest, ExecResult, str]
                                              ) -> None:
    req, res, text = honest
    # asked for logprobs, commits (and returns) none
    ev = _cheat(factory, req, replace(res, logprobs=None), text)
    v = judge(tiny_engine, ev.signed.receipt, ev.blob, SK)
    assert v.reason == "output_mismatch" and v.vote == res.hash


def test_fewer_alternatives_than_asked_is_nonconformant(
        tiny_engine: Engine, factory: EvidenceFactory,
        honest: tuple[ExecRequest, ExecResult, str]) -> None:
    req, _, text = honest
    # a self-consistent claim for top_logprobs=1 (honestly computed for that request), while
    # the client asked for 3: replay alone would agree, the request rule must not
    cheap_req = replace(req, top_logprobs=1)
    gen = tiny_engine.generate(list(req.prompt_token_ids), req.sampling_params(),
                               top_logprobs=1)
    ev = _cheat(factory, cheap_req, ExecResult.from_generation(gen), text)
    v = judge(tiny_engine, ev.signed.receipt, ev.blob, SK)
    assert v.vote == INVALID_EVIDENCE and v.reason == "request_nonconformant"

