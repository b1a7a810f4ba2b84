"""Attack on an honest operator through the size of its own evidence: a user asks for an answer
whose DA blob is larger than any DA backend takes, then claims the receipt unpublished.

Each choice's blob seals the request body and the *whole* response body (every choice, with
its logprobs), uncompressed. A legal body does it: ``n: 8``, a few thousand tokens each,
``logprobs: true, top_logprobs: 20`` (~1.4 KB of JSON per token), or a request body padded to
the 4 MiB bound: past ``DEFAULT_MAX_BLOB_BYTES`` (32 MiB, the EigenDA proxy's limit and every
backend's default). The operator signed it anyway and handed the receipts out; then in stream
mode the committer rejects the entry ("ciphertext exceeds the DA limit": acknowledged, deleted,
never batched) and in single-process mode the publisher's put fails and is retried forever.
Either way the receipts are in no batch by their deadline: every one a claim the user wins
(``slashAmount`` per receipt, α of it to the claimant, the bond back) at the cost of one request.

Now the issuer refuses to sign a blob no DA backend takes (a 400 naming the response size):
no receipt exists that cannot be published."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import httpx
import pytest

from support.inproc import serving
from verinfer.da_client.base import DEFAULT_MAX_BLOB_BYTES
from verinfer.da_client.errors import BlobTooLargeError
from verinfer.da_client.local import LocalDAClient
from verinfer.da_client.outbox import Outbox
from verinfer.engine.engine import Engine, GenerationResult
from verinfer.engine.loader import LoadedModel, load_model
from verinfer.engine.tiny import write_tiny_llama
from verinfer.errors import ClientError
from verinfer.httpserve import ServeLimits
from verinfer.operator.app import ServerConfig, create_app
from verinfer.operator.evidence import (
    MAX_RESPONSE_EVIDENCE_BYTES,
    EvidencePipeline,
    Execution,
    ReceiptIssuer,
)
from verinfer.protocol.exec_request import ExecRequest
from verinfer.protocol.limits import MAX_BODY_BYTES
from verinfer.receipts.canonical import ExecResult
from verinfer.receipts.eip712 import Domain, ReceiptSigner
from verinfer.receipts.epoch_keys import EnvelopeSuite, derive_epoch_keypair

VECTORS = Path(__file__).resolve().parent.parent / "vectors" / "exec_requests.json"
LIMITS = ServeLimits(max_body_bytes=MAX_BODY_BYTES)


def test_an_answer_too_large_for_da_is_never_signed(tmp_path: Path) -> None:
    v = json.loads(VECTORS.read_text(encoding="utf-8"))
    request = ExecRequest.from_json(v["exec_requests"][0]["json"])
    result = ExecResult.from_json(v["exec_results"][0]["json"])
    _, pk = derive_epoch_keypair(hashlib.sha256(b"oversized epoch").digest(),
                                 EnvelopeSuite.X25519)
    issuer = ReceiptIssuer(ReceiptSigner(hashlib.sha256(b"oversized operator").digest()),
                           Domain(31337, "0x" + "11" * 20), 1, pk)
    da = LocalDAClient(tmp_path / "da")
    body = b'{"model": "m", "prompt": "hi"}'
    # a response the DA still takes: signed, and its blob publishes
    signed, blob = issuer.issue(request, result, body, b"x" * (1 << 20))
    assert signed.receipt.ciphertext_hash == hashlib.sha256(blob).digest()
    da.put(blob)
    # one past the limit: before, signed with a blob every DA backend refuses
    big = b"x" * DEFAULT_MAX_BLOB_BYTES
    with pytest.raises(BlobTooLargeError):
        da.put(b"\0" * (DEFAULT_MAX_BLOB_BYTES + 1))
    with pytest.raises(ClientError) as e:
        issuer.issue(request, result, body, big)
    assert e.value.status_code == 400 and "DA" in e.value.message


def test_one_request_multiplies_its_body_into_every_choices_evidence(tmp_path: Path) -> None:
    """The same request, made quadratic: a body padded to the 4 MiB bound (``user`` has no
    length bound) with 16 prompts and ``n: 8`` is 128 choices, each blob sealing the whole body:
    512 MiB of ciphertext built, encrypted and handed to the stream in one publish (one Lua
    call under a 2 s deadline, past Redis's 1 GiB query buffer with larger responses: a 503
    that blocks the replica's readiness) for 128 tokens of compute. Now a response whose
    evidence would pass MAX_RESPONSE_EVIDENCE_BYTES is refused before anything is sealed."""
    v = json.loads(VECTORS.read_text(encoding="utf-8"))
    request = ExecRequest.from_json(v["exec_requests"][0]["json"])
    path = write_tiny_llama(tmp_path / "tiny.gguf", seed=0)
    engine = Engine(load_model(path), "invariant", max_seqs=2, max_batch_tokens=32)
    try:
        gen = GenerationResult(prompt_ids=list(request.prompt_token_ids), token_ids=[5],
                               text="a", finish_reason="length", step_digests=[b"\0" * 32],
                               seed=request.seed)
        _, pk = derive_epoch_keypair(hashlib.sha256(b"oversized epoch").digest(),
                                     EnvelopeSuite.X25519)
        recorded: list[object] = []
        pipeline = EvidencePipeline(
            engine, ReceiptSigner(hashlib.sha256(b"oversized operator").digest()),
            Domain(31337, "0x" + "11" * 20), 1, pk, Outbox(tmp_path / "outbox"), "local",
            record=lambda items, owner: recorded.extend(items))
        body = json.dumps({"model": "m", "prompt": ["a"] * 16, "n": 8, "max_tokens": 1,
                           "user": "x" * (4 * 1024 * 1024 - 200)}).encode()
        response = b'{"choices": []}'
        assert 128 * len(body) > MAX_RESPONSE_EVIDENCE_BYTES
        with pytest.raises(ClientError) as e:
            pipeline.publish([Execution(request, gen)] * 128, body, response)
        assert e.value.status_code == 400 and not recorded
        # an ordinary multi-choice answer is served
        out = pipeline.publish([Execution(request, gen)] * 8, b'{"prompt": "a", "n": 8}',
                               response)
        assert len(out["choices"]) == 8 and len(recorded) == 8
    finally:
        engine.close()


def test_a_body_too_big_for_its_choices_evidence_is_refused_before_the_engine(
        tiny_loaded: LoadedModel, tmp_path: Path) -> None:
    """Over HTTP (the real server, evidence on): the padded 16-prompt, n 8 body is a 400
    ``evidence_too_large`` before any job reaches the engine. Before, the 128 choices ran, and
    their evidence (512 MiB) was refused only once generated: the compute spent, and a stream's
    content sent without a receipt."""
    engine = Engine(tiny_loaded, "invariant", max_seqs=4, max_batch_tokens=48)
    try:
        _, pk = derive_epoch_keypair(hashlib.sha256(b"oversized epoch").digest(),
                                     EnvelopeSuite.X25519)
        outbox = Outbox(tmp_path / "outbox.db")
        evidence = EvidencePipeline(
            engine, ReceiptSigner(hashlib.sha256(b"oversized operator").digest()),
            Domain(31337, "0x" + "11" * 20), 1, pk, outbox, "local")
        app = create_app(engine, "tiny", ServerConfig(evidence=evidence, http_limits=LIMITS))
        body = {"model": "tiny", "prompt": ["a"] * 16, "n": 8, "max_tokens": 1,
                "user": "x" * (4 * 1024 * 1024 - 200)}
        with serving(app, LIMITS) as (host, port), \
                httpx.Client(base_url=f"http://{host}:{port}", timeout=60) as c:
            steps = engine.steps
            for stream in (False, True):
                r = c.post("/v1/completions", json={**body, "stream": stream})
                assert r.status_code == 400, r.text[:300]
                assert r.json()["error"]["code"] == "evidence_too_large"
            assert engine.steps == steps  # nothing ran
            ok = c.post("/v1/completions", json={**body, "user": "u", "max_tokens": 1})
            assert ok.status_code == 200, ok.text[:300]
    finally:
        engine.close()
