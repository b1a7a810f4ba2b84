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
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import cbor2
import pytest

from verinfer.chain.structs import INVALID_EVIDENCE
from verinfer.da_client.base import DEFAULT_MAX_BLOB_BYTES
from verinfer.engine.engine import Engine
from verinfer.errors import ContextLengthExceededError
from verinfer.protocol.errors import ReceiptFormatError
from verinfer.protocol.exec_request import (
    MAX_CBOR,
    MAX_CONTEXT_TOKENS,
    MAX_TOP_LOGPROBS,
    CborBound,
    ExecRequest,
    check_cbor_size,
)
from verinfer.protocol.request_rule import ServedModel, parse_body, resolve_max_tokens
from verinfer.receipts.canonical import ExecResult
from verinfer.receipts.eip712 import Domain, ReceiptSigner
from verinfer.receipts.envelope import EnvelopeBinding, EnvelopeContents, envelope_header
from verinfer.receipts.epoch_keys import EnvelopeSuite, derive_epoch_keypair
from verinfer.testing.evidence import EvidenceFactory, request_for_body
from verinfer.verifier.reexec import judge

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
             claimed: ExecResult, plaintext: bytes) -> tuple[bytes, str]:
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
    # refused before it is built: by the count (an ExecRequest has three arrays/maps, the DAG
    # brings more) or, for a DAG that fits, by its tag (test_every_tag_but_bignums_...)
    with pytest.raises(ReceiptFormatError, match=r"tag 28 is not allowed|arrays/maps"):
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
        # the envelope map holds no array (a tagged one is refused for that first)
        (EnvelopeContents.from_bytes, cbor2.dumps({"version": 2,
                                                   "padding": cbor2.CBORTag(tag, 1)})),
    ]
    for decode, data in cases:
        with pytest.raises(ReceiptFormatError, match=f"tag {tag} is not allowed"):
            decode(data)


def test_bignums_still_decode() -> None:
    """Tags 2/3 stay readable (linear in their bytes), so an out-of-range integer is refused
    by its field's name, as the format tests expect."""
    ok = cbor2.loads(cbor2.dumps({"seed": 1 << 64}))
    from verinfer.protocol.exec_request import decode_cbor
    assert decode_cbor(cbor2.dumps({"seed": 1 << 64}), "test") == ok


# ---- honest-shaped bombs: no tag, only many cheap items -----------------------------------------
# The attack: CBOR of the right shape but 32 MiB (the DA blob cap) of one-byte items — empty
# arrays in ``logprobs``, tiny ints in ``output_token_ids``, ``[[]]`` pairs — decodes to one
# Python object per byte (~80 bytes for an empty array: ~2.5 GB and ~15 s measured) before the
# schema check refuses it, in every verifier of the committee at once: an OOM or a stalled
# job, so no vote against the cheat. The fix counts the heads against what the structure's
# schema can hold (``CborBound``) before building anything.

BLOB_CAP = DEFAULT_MAX_BLOB_BYTES
#: Peak memory and time a refusal may take (the honest decode of the same 32 MiB took ~2.5 GB).
BOMB_PEAK_MB = 200
BOMB_SECONDS = 2.0
_RESULT = {"version": 2, "output_token_ids": [], "finish_reason": "stop",
           "logit_digest": bytes(32), "text_sha256": bytes(32), "logprobs": None}


def _with(key: str, head_count: int, body: bytes) -> bytes:
    """The canonical empty ExecResult with ``key``'s value replaced by an array of
    ``head_count`` items whose bytes are ``body`` (written by hand: cbor2 would need the
    objects, which is the memory this test is about)."""
    pre = cbor2.dumps({**_RESULT, key: 0}, canonical=True)
    at = pre.index(cbor2.dumps(key)) + len(cbor2.dumps(key))
    assert pre[at] == 0
    return pre[:at] + b"\x9b" + head_count.to_bytes(8, "big") + body + pre[at + 1:]


def _bomb(kind: str) -> tuple[str, bytes]:
    room = BLOB_CAP - 256
    if kind == "empty_arrays":
        return "result", _with("logprobs", room, b"\x80" * room)
    if kind == "tiny_ints":
        return "result", _with("output_token_ids", room, b"\x00" * room)
    if kind == "nested_pairs":  # [[]] defeats a count of one-byte runs; its head announces
        return "result", _with("logprobs", room // 2, b"\x81\x80" * (room // 2))
    if kind == "many_small_arrays":  # every array within T: only the total gives it away
        inner = b"\x98\xff" + b"\x80" * 255
        n = room // len(inner)
        return "result", _with("logprobs", n, inner * n)
    if kind == "envelope_padding":
        head = cbor2.dumps({"version": 2, "padding": 0}, canonical=True)[:-1]
        return "envelope", head + b"\x9b" + room.to_bytes(8, "big") + b"\x80" * room
    raise AssertionError(kind)


#: Decodes the blob in a fresh process (peak RSS is per process) that imports only the receipts.
_PROBE = r"""
import json, sys, time
from pathlib import Path
from verinfer.receipts.canonical import ExecResult
from verinfer.receipts.envelope import EnvelopeContents
from verinfer.receipts.errors import ReceiptFormatError
where, blob = sys.argv[1], Path(sys.argv[2]).read_bytes()
def status_kb(key):
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(key + ":"))
with open("/proc/self/clear_refs", "w") as f:  # the high-water mark restarts here (Linux 4.0+):
    f.write("5")                                # the imports' own peak is not the decoder's
before, t = status_kb("VmRSS"), time.perf_counter()
try:
    (ExecResult.from_canonical if where == "result" else EnvelopeContents.from_bytes)(blob)
    outcome = "accepted"
except ReceiptFormatError as e:
    outcome = "refused: " + str(e)[:200]
print(json.dumps({"outcome": outcome, "seconds": time.perf_counter() - t,
                  "peak_growth_mb": (status_kb("VmHWM") - before) / 1024}))
"""


@pytest.mark.parametrize("kind", ["empty_arrays", "tiny_ints", "nested_pairs",
                                  "many_small_arrays", "envelope_padding"])
def test_blob_cap_of_tiny_items_is_refused_in_bounded_memory_and_time(
        kind: str, tmp_path: Path) -> None:
    """Each shape fills the whole 32 MiB blob cap. Before the fix: ~2.4 GB and ~17 s (empty
    arrays); after: refused while counting heads, well under a second."""
    where, blob = _bomb(kind)
    assert BLOB_CAP - 1024 < len(blob) <= BLOB_CAP
    (tmp_path / "blob").write_bytes(blob)
    out = subprocess.run([sys.executable, "-c", _PROBE, where, str(tmp_path / "blob")],
                         capture_output=True, text=True, timeout=120, check=True)
    r = json.loads(out.stdout.strip().splitlines()[-1])
    assert r["outcome"].startswith("refused: "), r
    assert "more than any valid one holds" in r["outcome"], r
    assert r["peak_growth_mb"] < BOMB_PEAK_MB, r
    assert r["seconds"] < BOMB_SECONDS, r


def test_honest_shaped_bomb_is_voted_against_without_building_it(
        factory: EvidenceFactory, tiny_engine: Engine) -> None:
    """The whole job: the cheat seals a blob-cap ExecResult of empty arrays; the verifier
    refuses it as malformed evidence (a vote against the operator) within seconds."""
    request, fake = _fake_answer(factory, tiny_engine)
    _, bomb = _bomb("empty_arrays")
    t = time.perf_counter()
    vote, reason = _verdict(factory, tiny_engine, request, fake,
                            _plaintext(request.canonical, bomb))
    assert (vote, reason) == (INVALID_EVIDENCE, "evidence_mismatch")
    assert time.perf_counter() - t < 10  # unfixed: ~15 s and ~2.5 GB in this process


@pytest.mark.parametrize("chain", [b"\xc2", b"\xc3", b"\xc2\xc3"])
def test_a_chain_of_bignum_tags_is_refused_at_its_first_head(chain: bytes) -> None:
    """The attack: tags had no bound of their own in the head count, only the item bound, and
    each tag head takes the count's slow path. A cheat seals 32 MiB of bignum tag heads (each
    tagging the next; cbor2 refuses that only at depth 8, after the count): the count walked
    8.4 M heads before refusing (2.3 s in every verifier, against 0.05-0.32 s for the other
    blob-cap shapes). Fixed: a tag but a bignum over a byte string is refused on sight, as the
    decoder would. Measured as where the refusal happens, not as time."""
    pre = cbor2.dumps({**_RESULT, "logprobs": 0}, canonical=True)
    at = pre.index(cbor2.dumps("logprobs")) + len(cbor2.dumps("logprobs"))
    room = BLOB_CAP - 256
    blob = pre[:at] + chain * (room // len(chain)) + b"\x40" + pre[at + 1:]
    with pytest.raises(ReceiptFormatError, match=r"must hold a byte string \(at byte (\d+)\)"
                       ) as e:
        ExecResult.from_canonical(blob)
    where = int(str(e.value).rsplit("at byte ", 1)[1].rstrip(")"))
    assert where <= at + 1, where  # unfixed: refused at byte 8,388,628 by the item bound


def test_a_bignum_over_a_byte_string_still_counts() -> None:
    """What the tag check keeps: a bignum (tag 2 or 3 over a byte string) is two items."""
    data = cbor2.dumps([1 << 70, -(1 << 70)])
    assert data.count(b"\xc2") == data.count(b"\xc3") == 1
    _assert_exact(data, items=5, containers=1, strings=2)


# ---- the bounds are the schema's: what is valid still decodes ----------------------------------

def _counts_refused(data: bytes, bound: CborBound) -> bool:
    try:
        check_cbor_size(data, bound, "probe")
    except ReceiptFormatError:
        return True
    return False


def _assert_exact(data: bytes, items: int, containers: int, strings: int) -> None:
    """``data`` holds exactly these counts: allowed at them, refused one below any."""
    assert not _counts_refused(data, CborBound(items, containers, strings))
    assert _counts_refused(data, CborBound(items - 1, containers, strings))
    assert _counts_refused(data, CborBound(items, containers - 1, strings))
    assert _counts_refused(data, CborBound(items, containers, strings - 1))


def _result_with_logprobs(tokens: int, k: int) -> ExecResult:
    top = tuple((i, -float(i) - 0.5) for i in range(k))
    return ExecResult(output_token_ids=tuple(range(tokens)), finish_reason="length",
                      logit_digest=bytes(32), text_sha256=bytes(32),
                      logprobs=tuple((-0.25, top) for _ in range(tokens)))


@pytest.mark.parametrize("tokens", [1, 7])
def test_the_execresult_bound_is_its_schema_at_full_size(tokens: int) -> None:
    """An ExecResult of T tokens with the most alternatives holds 13 + T(4 + 3k) items,
    3 + T(2 + k) containers and 9 strings (counted on its real encoding); at T =
    MAX_CONTEXT_TOKENS that is MAX_CBOR: the largest valid one is never refused."""
    k = MAX_TOP_LOGPROBS
    data = _result_with_logprobs(tokens, k).canonical
    _assert_exact(data, 13 + tokens * (4 + 3 * k), 3 + tokens * (2 + k), 9)
    t = MAX_CONTEXT_TOKENS
    assert MAX_CBOR.items == 13 + t * (4 + 3 * k)
    assert MAX_CBOR.containers == 3 + t * (2 + k)
    assert MAX_CBOR.strings >= 9


def test_a_large_legitimate_result_still_decodes() -> None:
    """10,000 tokens with 20 alternatives (~1 MB here, 640,013 items): counted, let through."""
    result = _result_with_logprobs(10_000, MAX_TOP_LOGPROBS)
    assert ExecResult.from_canonical(result.canonical) == result


def test_the_largest_legitimate_request_still_decodes() -> None:
    """A prompt that fills the protocol's context but one token, ids across a Gemma-size
    vocabulary, the most stop strings, a commitment: decodes; one id more is refused."""
    ids = tuple((i * 7919) % 262_144 for i in range(MAX_CONTEXT_TOKENS - 1))
    request = ExecRequest(model_id=bytes(range(32)), tokenizer_hash=bytes(32),
                          engine_fingerprint='{"backend":"torch-cpu"}', prompt_token_ids=ids,
                          max_tokens=1, temperature=0.7, top_k=40, top_p=0.9,
                          stop=("a", "b", "c", "d"), seed=2**64 - 1, ignore_eos=False,
                          prompt_commitments=bytes(32), top_logprobs=20)
    assert ExecRequest.from_canonical(request.canonical) == request
    _assert_exact(request.canonical, 1 + 28 + len(ids) + 4, 3, 14 + 1 + 4 + 3)
    assert ExecRequest.CBOR_BOUND.items >= 1 + 28 + MAX_CONTEXT_TOKENS + 4
    flood = replace(request, prompt_token_ids=(0,) * ExecRequest.CBOR_BOUND.items)
    with pytest.raises(ReceiptFormatError, match=r"more than \d+ CBOR items"):
        ExecRequest.from_canonical(flood.canonical)


def test_a_request_with_one_container_too_many_is_refused_by_the_count() -> None:
    """The ExecRequest holds at most CBOR_BOUND.containers arrays/maps (the map, the prompt,
    the stops, the logit bias's list and its pairs): lists in a float field that pass that
    count are refused before the prompt behind them is built."""
    request = _small_request()
    m = {**request.as_map(), "top_p": [[]] * ExecRequest.CBOR_BOUND.containers}
    with pytest.raises(ReceiptFormatError, match="arrays/maps"):
        ExecRequest.from_canonical(cbor2.dumps(m, canonical=True))


def _small_request() -> ExecRequest:
    return ExecRequest(model_id=bytes(32), tokenizer_hash=bytes(32), engine_fingerprint="{}",
                       prompt_token_ids=tuple(range(100)), max_tokens=4, temperature=0.0,
                       top_k=0, top_p=1.0, stop=(), seed=1, ignore_eos=False)


@pytest.mark.parametrize("data", [
    b"\x9b" + (2**40).to_bytes(8, "big") + b"\x80" * 100,  # announces more than it has
    b"\x82\x00",  # truncated
    b"\x9f\x00\xff",  # indefinite length
    b"\x82\x59\xff\xff\x00",  # a string that runs past the end
])
def test_truncated_or_indefinite_heads_are_refused_by_the_count(data: bytes) -> None:
    with pytest.raises(ReceiptFormatError, match=r"truncated|indefinite"):
        check_cbor_size(data, CborBound(2**50, 1, 1), "probe")


@pytest.mark.parametrize("max_tokens", [None, 1, 2])
def test_the_rule_never_plans_more_tokens_than_the_decoder_admits(max_tokens: int | None) -> None:
    """The bound is only safe if no honest operator exceeds it: a model with a 1 M context
    would otherwise plan a request the committee refuses as malformed (an honest operator
    voted against). The rule reads the context as min(model's, MAX_CONTEXT_TOKENS)."""
    ids = [5] * (MAX_CONTEXT_TOKENS - 1)
    body = {"model": "m", "prompt": ids, "max_tokens": max_tokens} if max_tokens else {
        "model": "m", "prompt": ids}
    model = ServedModel(model_id=bytes(32), tokenizer_hash=bytes(32), engine_fingerprint="{}",
                        context_length=1_000_000, vocab_size=16)
    policy = parse_body(body, "completions").policy
    if max_tokens == 2:  # one more than the protocol's context holds: refused on both sides
        with pytest.raises(ContextLengthExceededError, match=str(MAX_CONTEXT_TOKENS)):
            resolve_max_tokens(policy, len(ids), model.context_length)
        return
    planned = resolve_max_tokens(policy, len(ids), model.context_length)
    assert planned == 1
    result = ExecResult(output_token_ids=(5,) * planned, finish_reason="length",
                        logit_digest=bytes(32), text_sha256=bytes(32))
    assert ExecResult.from_canonical(result.canonical) == result
