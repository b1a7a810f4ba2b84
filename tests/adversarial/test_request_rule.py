"""Issue 14 items 1-2: attacks on the request rule, each carried out step by step.

1. Signed zero: a client sends ``"temperature": -0.0`` (or ``-0e5``) without a seed, then
   challenges the receipt, hoping the verifier derives another seed than the operator did
   (that got an honest operator slashed). Through the real server and the real verifier job.
2. Omitted max_tokens: the operator picks the output limit (and with it the derived seed) to
   truncate the answer or shop for a sample it likes. The rule fixes the value; every other
   choice is voted nonconformant by the real job.
3. n > 1: the operator re-seeds a choice with a seed of its choosing.
4. A server window smaller than the rule's default: the server refuses; it never shortens.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import httpx
import pytest

from support.request_rule import judge_all, post, served
from support.servers import launched_server, operator_init
from verinfer.chain.structs import INVALID_EVIDENCE
from verinfer.engine.engine import Engine
from verinfer.engine.served import prompt_tokenizer, served_model
from verinfer.protocol import limits as L
from verinfer.protocol.exec_request import ExecRequest
from verinfer.protocol.request_rule import (
    ChatTurn,
    choice_seed,
    exec_requests,
    parse_body,
    request_seed,
)
from verinfer.receipts.canonical import ExecResult
from verinfer.receipts.eip712 import Domain, ReceiptSigner
from verinfer.receipts.epoch_keys import EnvelopeSuite, derive_epoch_keypair
from verinfer.testing.evidence import EvidenceFactory, request_for_body
from verinfer.verifier.reexec import judge

SIGNER = ReceiptSigner(hashlib.sha256(b"request-rule adversary").digest())
DOMAIN = Domain(31337, "0x5FbDB2315678afecb367f032d93F642f64180aa3")
SK, PK = derive_epoch_keypair(hashlib.sha256(b"request-rule epoch").digest(),
                              EnvelopeSuite.X25519)


@pytest.fixture(scope="module")
def operator_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("operator")
    operator_init(d)
    return d


@pytest.fixture(scope="module")
def server(tiny_path: Path, operator_dir: Path) -> Iterator[str]:
    with launched_server(tiny_path, "--operator-dir", str(operator_dir)) as s:
        yield s.base


@pytest.fixture(scope="module")
def factory(tiny_engine: Engine) -> EvidenceFactory:
    """Stands in for a cheating operator: the real sealing and signing library."""
    return EvidenceFactory(tiny_engine, SIGNER, DOMAIN, key_epoch=3, epoch_public_key=PK,
                           now=lambda: 1_800_000_000)


def _cheat(factory: EvidenceFactory, engine: Engine, body: bytes, request: ExecRequest
           ) -> str:
    """Runs ``request`` honestly and publishes it as the answer to ``body`` (a consistent
    envelope, a valid signature); returns the real job's verdict reason."""
    gen = engine.generate(list(request.prompt_token_ids), request.sampling_params())
    ev = factory._finish(body, request, ExecResult.from_generation(gen), gen.text)
    v = judge(engine, ev.signed.receipt, ev.blob, SK)
    return v.reason if v.vote == INVALID_EVIDENCE else "vote:" + v.reason


# ---- 1. signed zero ----------------------------------------------------------------------------
@pytest.mark.parametrize("endpoint", ["chat", "completions"])
def test_signed_zero_temperature_cannot_get_an_honest_operator_slashed(
        server: str, operator_dir: Path, tiny_path: Path, endpoint: str) -> None:
    head = ('{"model":"tiny","messages":[{"role":"user","content":"zero"}]' if endpoint == "chat"
            else '{"model":"tiny","prompt":"zero"')
    spellings = ["-0.0", "-0e5", "-0", "0", "0.0"]
    with httpx.Client() as client:
        answers = [served(post(client, server, body), body) for body in
                   (f'{head},"max_tokens":6,"n":2,"temperature":{t}}}'.encode()
                    for t in spellings)]
    # step 1: every spelling is one request — same ExecRequests, same derived seeds
    hashes = {tuple(e["req_hash"] for e in a.entries) for a in answers}
    assert len(hashes) == 1
    # step 2: the challenge — the real verifier job judges every receipt
    entries = [e for a in answers for e in a.entries]
    verdicts = judge_all(operator_dir, tiny_path, entries)
    assert [v["reason"] for v in verdicts] == ["match"] * len(entries)
    assert all(v["agrees"] for v in verdicts)


def test_signed_zero_seed_is_the_one_of_plain_zero(tiny_engine: Engine) -> None:
    """The bug's mechanics: the seed derived for -0.0 is the one derived for 0.0 (the old
    operator hashed the string "-0.0", the verifier "0.0")."""
    model, prompts = served_model(tiny_engine), prompt_tokenizer(tiny_engine)
    body = '{"model":"m","messages":[{"role":"user","content":"z"}],"max_tokens":4,' \
           '"temperature":%s}'
    neg = exec_requests((body % "-0.0").encode(), model, prompts)[0]
    pos = exec_requests((body % "0.0").encode(), model, prompts)[0]
    assert neg.seed == pos.seed and neg.hash == pos.hash
    assert str(neg.temperature) == "0.0"


# ---- 2. omitted max_tokens -----------------------------------------------------------------
def test_omitted_max_tokens_is_the_rules_value_on_the_real_server(
        server: str, operator_dir: Path, tiny_path: Path, tiny_engine: Engine) -> None:
    omitted = b'{"model":"tiny","messages":[{"role":"user","content":"go on"}],"temperature":0.9}'
    explicit = (b'{"model":"tiny","messages":[{"role":"user","content":"go on"}],'
                b'"temperature":0.9,"max_tokens":%d}' % L.DEFAULT_CHAT_MAX_TOKENS)
    with httpx.Client() as client:
        a, b = (served(post(client, server, x), x) for x in (omitted, explicit))
    req = ExecRequest.from_json(a.entries[0]["exec_request"])
    assert req.max_tokens == L.DEFAULT_CHAT_MAX_TOKENS  # room is 2048 - prompt: the default
    assert a.entries[0]["req_hash"] == b.entries[0]["req_hash"]
    assert [v["reason"] for v in judge_all(operator_dir, tiny_path, a.entries)] == ["match"]


def test_operator_cannot_truncate_or_shop_seeds_through_an_omitted_max_tokens(
        tiny_engine: Engine, factory: EvidenceFactory) -> None:
    body = b'{"model":"tiny","messages":[{"role":"user","content":"a story"}],"temperature":1}'
    honest = request_for_body(tiny_engine, body)
    assert honest.max_tokens == L.DEFAULT_CHAT_MAX_TOKENS
    assert _cheat(factory, tiny_engine, body, honest) == "vote:match"
    # the attack: any other limit, with the seed re-derived self-consistently for it (what an
    # operator shopping for a sample would publish) — every try is voted nonconformant
    policy = parse_body(body, "chat").policy
    for k in [*range(1, 17), 64, 255, 257, 500]:
        limit = replace(honest, max_tokens=k)
        shopped = replace(limit, seed=request_seed(honest.model_id, honest.prompt_token_ids,
                                                   k, policy))
        assert _cheat(factory, tiny_engine, body, shopped) == "request_nonconformant", k
        assert _cheat(factory, tiny_engine, body, limit) == "request_nonconformant", k


# ---- 3. n > 1: one seed per choice -------------------------------------------------------------
def test_a_choice_reseeded_by_the_operator_is_nonconformant(tiny_engine: Engine,
                                                           factory: EvidenceFactory) -> None:
    body = (b'{"model":"tiny","messages":[{"role":"user","content":"pick"}],"n":3,'
            b'"max_tokens":5,"seed":42}')
    honest = exec_requests(body, served_model(tiny_engine), prompt_tokenizer(tiny_engine))
    assert [r.seed for r in honest] == [choice_seed(42, i) for i in range(3)]
    for r in honest:
        assert _cheat(factory, tiny_engine, body, r) == "vote:match"
    # the operator picks its own seed for choice 1 (or one of a choice index the body does not
    # have): nonconformant
    for seed in (43, honest[1].seed ^ 1, choice_seed(42, 3), choice_seed(42, 7)):
        assert _cheat(factory, tiny_engine, body, replace(honest[1], seed=seed)) == \
            "request_nonconformant", seed


# ---- 4. a smaller server window refuses, never shortens ---------------------------------------
def test_a_server_window_too_small_for_the_default_refuses(server: str,
                                                           tiny_engine: Engine) -> None:
    # a chat prompt of 300-ish tokens: the rule's limit is min(256, 2048 - p) = 256, and the
    # test server's --max-context 512 cannot hold p + 256
    prompts = prompt_tokenizer(tiny_engine)
    content = "x"
    while len(prompts.chat([ChatTurn("user", content)])) < 300:
        content += " word"
    body = json.dumps({"model": "tiny", "messages": [{"role": "user",
                                                      "content": content}]}).encode()
    assert len(prompts.chat([ChatTurn("user", content)])) + L.DEFAULT_CHAT_MAX_TOKENS > 512
    with httpx.Client() as client:
        r = post(client, server, body)
    assert r.status_code == 400
    assert r.json()["error"]["code"] == "context_length_exceeded"


# ---- 5. one body, two meanings ------------------------------------------------------------------
def test_a_repeated_key_is_refused_by_the_server(server: str) -> None:
    """A client (or a proxy) that reads the first "temperature" sees 0, the server's parser the
    last: the server must refuse the body rather than pick one reading."""
    body = (b'{"model":"tiny","messages":[{"role":"user","content":"dup"}],"max_tokens":4,'
            b'"temperature":0,"temperature":2}')
    with httpx.Client() as client:
        r = post(client, server, body)
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_json"
