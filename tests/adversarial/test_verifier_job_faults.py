"""Forced abstention, job side (issue 14 item 3, issue 24 item 1): evidence a dishonest operator
controls must get a vote that is not the receipt's outHash (INVALID_EVIDENCE), never an error
that escapes the real re-execution job (which makes the member abstain) and never a crash.

Each test builds the cheating operator's envelope with the library (seal + sign, as the
operator's publisher does) and runs the real job (``reexec.judge`` on the tiny engine)."""

from __future__ import annotations

import hashlib
import json
import sys
from collections.abc import Iterator
from dataclasses import replace

import pytest

from verinfer.chain.structs import INVALID_EVIDENCE
from verinfer.engine.engine import Engine
from verinfer.protocol.exec_request import ExecRequest
from verinfer.receipts.canonical import ExecResult
from verinfer.receipts.eip712 import Domain, Receipt, ReceiptSigner
from verinfer.receipts.envelope import (
    MAGIC,
    SUITE_CODES,
    EnvelopeBinding,
    EnvelopeContents,
    ciphertext_hash,
    seal,
)
from verinfer.receipts.epoch_keys import EnvelopeSuite, derive_epoch_keypair
from verinfer.testing.evidence import chat_body, request_for_body
from verinfer.verifier.reexec import judge
from verinfer.verifier.votes import Verdict

SIGNER = ReceiptSigner(hashlib.sha256(b"cheating operator").digest())
DOMAIN = Domain(31337, "0x5FbDB2315678afecb367f032d93F642f64180aa3")
SK, PK = derive_epoch_keypair(hashlib.sha256(b"job faults epoch").digest(), EnvelopeSuite.X25519)
BODY = chat_body("forced abstention", max_tokens=4, seed=11)
#: ~190 KB of brackets: past the stdlib decoder's C stack once the recursion limit is 100000
BOMB = b"[" * 95_000 + b"]" * 95_000


@pytest.fixture
def eth_account_recursion_limit() -> Iterator[None]:
    """The condition of the attack: importing eth-account (py_ecc) sets the limit to 100000."""
    before = sys.getrecursionlimit()
    sys.setrecursionlimit(100_000)
    yield
    sys.setrecursionlimit(before)


def _receipt(request: ExecRequest, result: ExecResult, blob: bytes) -> Receipt:
    return Receipt.create(operator=SIGNER.address, chain_id=DOMAIN.chain_id,
                          model_id=request.model_id,
                          engine_fingerprint_hash=request.engine_fingerprint_hash,
                          req_hash=request.hash, out_hash=result.hash, key_epoch=1,
                          ciphertext_hash=ciphertext_hash(blob), now=lambda: 1_800_000_000)


def _sealed(request: ExecRequest, result: ExecResult, body: bytes) -> tuple[Receipt, bytes]:
    binding = EnvelopeBinding.for_execution(operator=SIGNER.address, chain_id=DOMAIN.chain_id,
                                            key_epoch=1, request=request, result=result)
    blob = seal(EnvelopeContents(request, result, body, b"{}"), binding, PK)
    return _receipt(request, result, blob), blob


def _claimed(engine: Engine, request: ExecRequest) -> ExecResult:
    honest = replace(request, max_tokens=4)
    return ExecResult.from_generation(engine.generate(list(honest.prompt_token_ids),
                                                      honest.sampling_params()))


def _assert_invalid(v: Verdict, receipt: Receipt, reason: str) -> None:
    assert (v.reason, v.vote) == (reason, INVALID_EVIDENCE)
    assert v.vote != receipt.out_hash  # with quorum on it the operator is slashed


def test_unknown_tokenizer_under_the_approved_model_is_voted_not_abstained(
        tiny_engine: Engine) -> None:
    request = replace(request_for_body(tiny_engine, BODY),
                      tokenizer_hash=hashlib.sha256(b"a tokenizer nobody approved").digest())
    receipt, blob = _sealed(request, _claimed(tiny_engine, request), BODY)
    _assert_invalid(judge(tiny_engine, receipt, blob, SK), receipt, "tokenizer_mismatch")


def test_max_tokens_beyond_the_context_is_voted_not_an_escaping_error(
        tiny_engine: Engine) -> None:
    """The body asks for more tokens than the context holds; the operator signs an answer
    anyway. Before: ContextLengthExceededError escaped the job and every member abstained."""
    huge = tiny_engine.max_context + 1
    body = chat_body("forced abstention", max_tokens=huge, seed=11)
    request = replace(request_for_body(tiny_engine, BODY), max_tokens=huge)
    receipt, blob = _sealed(request, _claimed(tiny_engine, request), body)
    v = judge(tiny_engine, receipt, blob, SK)
    # the request rule refuses such a body outright; the engine would refuse the request too
    assert v.reason in ("request_nonconformant", "request_unexecutable")
    _assert_invalid(v, receipt, v.reason)


def test_nested_json_request_body_does_not_kill_the_job(
        tiny_engine: Engine, eth_account_recursion_limit: None) -> None:
    request = request_for_body(tiny_engine, BODY)
    receipt, blob = _sealed(request, _claimed(tiny_engine, request), BOMB)
    v = judge(tiny_engine, receipt, blob, SK)  # before the fix: SIGSEGV of the whole process
    _assert_invalid(v, receipt, "request_nonconformant")
    assert "depth" in v.detail


@pytest.mark.parametrize("body", [
    b"not json at all \xff",
    b'{"messages": 5, "max_tokens": 4, "seed": 11}',
    b'{"messages": [{"role": "user", "content": "x"}], "stop": 5, "max_tokens": 4}',
    b'{"messages": [{"role": "user", "content": "x"}], "top_k": "many", "max_tokens": 4}',
    b"[1, 2, 3]",
], ids=["not-json", "messages-int", "stop-int", "top-k-str", "array"])
def test_unreadable_request_bodies_are_voted(tiny_engine: Engine, body: bytes) -> None:
    request = request_for_body(tiny_engine, BODY)
    receipt, blob = _sealed(request, _claimed(tiny_engine, request), body)
    _assert_invalid(judge(tiny_engine, receipt, blob, SK), receipt, "request_nonconformant")


@pytest.mark.parametrize("plaintext", [
    b"\xff\x00 not cbor",
    b"\x81" * 50_000 + b"\x00",  # nested CBOR arrays
    json.dumps({"version": 1}).encode(),
], ids=["not-cbor", "nested-cbor", "json-not-cbor"])
def test_malformed_plaintext_is_voted(tiny_engine: Engine, plaintext: bytes,
                                      eth_account_recursion_limit: None) -> None:
    """A dishonest sealer encrypts garbage under the receipt's binding (HPKE directly)."""
    request = request_for_body(tiny_engine, BODY)
    result = _claimed(tiny_engine, request)
    binding = EnvelopeBinding.for_execution(operator=SIGNER.address, chain_id=DOMAIN.chain_id,
                                            key_epoch=1, request=request, result=result)
    suite = PK.suite
    blob = (MAGIC + bytes([SUITE_CODES[suite]]) + (1).to_bytes(8, "big")
            + suite.hpke.encrypt(plaintext, PK.hpke, binding.info(suite)))
    receipt = _receipt(request, result, blob)
    _assert_invalid(judge(tiny_engine, receipt, blob, SK), receipt, "evidence_mismatch")


def test_honest_evidence_still_matches(tiny_engine: Engine) -> None:
    """The new checks do not touch an honest receipt (so no honest operator is slashed)."""
    request = request_for_body(tiny_engine, BODY)
    result = ExecResult.from_generation(tiny_engine.generate(list(request.prompt_token_ids),
                                                             request.sampling_params()))
    receipt, blob = _sealed(request, result, BODY)
    v = judge(tiny_engine, receipt, blob, SK)
    assert v.reason == "match" and v.agrees
