"""A cheating operator seals an envelope that stalls the committee instead of convicting it.

The attack: the operator serves a fake answer and signs a receipt for it, as any cheat does,
but the plaintext it seals is CBOR that makes every verifier's decoder run forever. cbor2 gives
tags meaning by default; with tags 28/29 (shared values) a 300-byte ExecResult decodes to a DAG
whose tree has 3^40 nodes. Every walk over it — the list-to-tuple freeze of ``logprobs``, the
``repr`` in an error message, ``hash`` of a map key — never ends, so the job never votes, the
challenge ends without a verdict and the cheat keeps its stake. Who gains: any operator with a
receipt it expects to be challenged. Cost to it: nothing (the blob is tiny).

The fix (``verinfer.protocol.exec_request.decode_cbor``, the one decoder of another party's
CBOR): no tags but bignums, no indefinite lengths, text/bytes map keys only, bounded depth, so
decoding is linear and the envelope is refused as malformed evidence — a vote against the
operator (``evidence_mismatch``), judged by the real verifier job on the real tiny engine.
"""

from __future__ import annotations

import hashlib
import json
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

import cbor2
import pytest

from verinfer.engine.engine import Engine
from verinfer.receipts import Domain, EnvelopeSuite, ExecResult, ReceiptSigner, derive_epoch_keypair
from verinfer.receipts.canonical import ExecRequest
from verinfer.receipts.envelope import EnvelopeBinding, EnvelopeContents, envelope_header
from verinfer.receipts.errors import ReceiptFormatError
from verinfer.testing.evidence import EvidenceFactory, request_for_body
from verinfer.verifier.reexec import judge
from verinfer.verifier.votes import INVALID_EVIDENCE

SIGNER = ReceiptSigner(hashlib.sha256(b"cbor bomb adversary").digest())
DOMAIN = Domain(31337, "0x5FbDB2315678afecb367f032d93F642f64180aa3")
SK, PK = derive_epoch_keypair(hashlib.sha256(b"cbor bomb epoch").digest(), EnvelopeSuite.X25519)
BODY = json.dumps({"model": "tiny", "messages": [{"role": "user", "content": "bomb"}],
                   "max_tokens": 4, "seed": 5}, separators=(",", ":")).encode()
#: Wall-clock bound for one verdict; an honest judge of this tiny request takes well under 1 s.
VERDICT_BOUND_S = 30


@contextmanager
def bounded(seconds: int) -> Iterator[None]:
    """Fails the test (TimeoutError) instead of hanging when the guarded code does not end:
    the pre-fix freeze loop is Python, so the alarm interrupts it."""
    def expire(*_: object) -> None:
        raise TimeoutError(f"no verdict within {seconds} s: the decoder is walking a bomb")

    old = signal.signal(signal.SIGALRM, expire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def dag(levels: int, width: int = 3) -> list[Any]:
    """A list whose tree has width^levels leaves, built from ``levels`` shared lists."""
    x: list[Any] = [0] * width
    for _ in range(levels):
        x = [x] * width
    return x


def shared(obj: object) -> bytes:
    """CBOR with value sharing (tags 28/29): the DAG is written once per distinct list."""
    return cbor2.dumps(obj, value_sharing=True, canonical=True)


@pytest.fixture(scope="module")
def factory(tiny_engine: Engine) -> EvidenceFactory:
    return EvidenceFactory(tiny_engine, SIGNER, DOMAIN, key_epoch=9, epoch_public_key=PK,
                           now=lambda: 1_800_000_000)


def _seal_raw(factory: EvidenceFactory, request: ExecRequest, claimed: ExecResult,
              plaintext: bytes) -> bytes:
    """A blob behind the real header, HPKE-sealed under the receipt's binding, whose plaintext
    is whatever the cheat chose (``seal`` would refuse it; a dishonest sealer calls HPKE)."""
    binding = EnvelopeBinding.for_execution(
        operator=factory.operator, chain_id=DOMAIN.chain_id, key_epoch=factory.key_epoch,
        request=request, result=claimed)
    suite = PK.suite
    return envelope_header(suite, factory.key_epoch) + suite.hpke.encrypt(
        plaintext, PK.hpke, binding.info(suite))


def _plaintext(request_bytes: bytes, result_bytes: bytes) -> bytes:
    return cbor2.dumps({"version": 2, "exec_request": request_bytes, "exec_result": result_bytes,
                        "request_body": BODY, "response_body": b"{}", "padding": b""},
                       canonical=True)


def _fake_answer(factory: EvidenceFactory, tiny_engine: Engine) -> tuple[ExecRequest,
                                                                            ExecResult]:
    """The cheat's receipt commits to an answer the model never gave."""
    request = request_for_body(tiny_engine, BODY)
    gen = tiny_engine.generate(list(request.prompt_token_ids), request.sampling_params())
    fake = replace(ExecResult.from_generation(gen),
                   text_sha256=hashlib.sha256(b"cheap fake answer").digest())
    return request, fake


def _verdict(factory: EvidenceFactory, tiny_engine: Engine, request: ExecRequest,
             claimed: ExecResult, plaintext: bytes) -> tuple[str, str]:
    blob = _seal_raw(factory, request, claimed, plaintext)
    signed = factory.issuer.sign(request, claimed, blob)
    with bounded(VERDICT_BOUND_S):
        v = judge(tiny_engine, signed.receipt, blob, SK)
    return v.vote, v.reason


def test_shared_value_dag_in_logprobs_is_voted_against_not_walked(
        factory: EvidenceFactory, tiny_engine: Engine) -> None:
    request, fake = _fake_answer(factory, tiny_engine)
    bomb = shared({**fake.as_map(), "logprobs": [dag(40)]})
    assert len(bomb) < 1000  # 3^40 leaves in under a kilobyte
    vote, reason = _verdict(factory, tiny_engine, request, fake,
                            _plaintext(request.canonical, bomb))
    assert (vote, reason) == (INVALID_EVIDENCE, "evidence_mismatch")


def test_shared_value_dag_in_the_request_is_voted_against(
        factory: EvidenceFactory, tiny_engine: Engine) -> None:
    """The same bomb in an ExecRequest field: before the fix the format error's message was
    ``repr`` of the DAG (exponential time and memory); here a small one shows the refusal."""
    request, fake = _fake_answer(factory, tiny_engine)
    bomb = shared({**request.as_map(), "stop": dag(2)})
    vote, reason = _verdict(factory, tiny_engine, request, fake,
                            _plaintext(bomb, fake.canonical))
    assert (vote, reason) == (INVALID_EVIDENCE, "evidence_mismatch")
    with pytest.raises(ReceiptFormatError, match="tag 28 is not allowed"):
        ExecRequest.from_canonical(bomb)


def test_huge_bignum_seed_is_a_format_error_not_a_crash(
        factory: EvidenceFactory, tiny_engine: Engine) -> None:
    """A 4,000-byte bignum seed: the field check's message used to ``repr`` it, which raises a
    bare ValueError past sys.get_int_max_str_digits — an untyped failure of the job instead of
    a vote."""
    request, fake = _fake_answer(factory, tiny_engine)
    bomb = cbor2.dumps({**request.as_map(), "seed": 1 << 32000}, canonical=True)
    with pytest.raises(ReceiptFormatError, match="seed"):
        ExecRequest.from_canonical(bomb)
    vote, reason = _verdict(factory, tiny_engine, request, fake,
                            _plaintext(bomb, fake.canonical))
    assert (vote, reason) == (INVALID_EVIDENCE, "evidence_mismatch")


@pytest.mark.parametrize("tag", [1, 24, 25, 28, 29, 256, 258, 55799, 40000])
def test_every_tag_but_bignums_is_refused_by_every_decoder(tag: int) -> None:
    """No canonical structure has a tag: each of the three decoders refuses one on sight."""
    tagged = cbor2.CBORTag(tag, [1])
    result = {"version": 2, "output_token_ids": [], "finish_reason": "stop",
              "logit_digest": bytes(32), "text_sha256": bytes(32), "logprobs": None}
    assert ExecResult.from_canonical(cbor2.dumps(result, canonical=True)).logprobs is None
    cases: list[tuple[Any, bytes]] = [
        (ExecResult.from_canonical, cbor2.dumps({**result, "logprobs": tagged})),
        (ExecRequest.from_canonical, cbor2.dumps(tagged)),
        (EnvelopeContents.from_bytes, cbor2.dumps({"version": 2, "padding": tagged})),
    ]
    for decode, data in cases:
        with pytest.raises(ReceiptFormatError, match=f"tag {tag} is not allowed"):
            decode(data)


def test_bignums_still_decode() -> None:
    """Tags 2/3 stay readable (linear in their bytes), so an out-of-range integer is refused
    by its field's name, as the format tests expect."""
    ok = cbor2.loads(cbor2.dumps({"seed": 1 << 64}))
    from verinfer.receipts.canonical import decode_cbor
    assert decode_cbor(cbor2.dumps({"seed": 1 << 64}), "test") == ok
