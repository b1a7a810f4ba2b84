"""ExecRequest / ExecResult: canonical CBOR round trips, strict decoding, and engine mapping."""

from __future__ import annotations

import hashlib
import json
import struct
from dataclasses import fields, replace
from typing import Any

import cbor2
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from support.engine_requests import exec_request_for
from verinfer.engine.engine import Engine
from verinfer.protocol.errors import (
    NonCanonicalEncodingError,
    ReceiptFormatError,
    UnsupportedVersionError,
)
from verinfer.protocol.exec_request import ExecRequest
from verinfer.protocol.sampling_params import SamplingParams
from verinfer.receipts.canonical import ExecResult
from verinfer.receipts.eip712 import Domain, Receipt, ReceiptSigner, verify_receipt

b32 = st.binary(min_size=32, max_size=32)
u32 = st.integers(0, 2**32 - 1)
requests = st.builds(
    ExecRequest, model_id=b32, tokenizer_hash=b32, engine_fingerprint=st.text(min_size=1),
    prompt_token_ids=st.lists(u32, min_size=1, max_size=40).map(tuple),
    max_tokens=st.integers(1, 2**32 - 1),
    temperature=st.floats(0.0, 2.0, allow_nan=False),
    top_k=u32, top_p=st.floats(0.0, 1.0, exclude_min=True),
    stop=st.lists(st.text(min_size=1, max_size=8), max_size=4).map(tuple),
    seed=st.integers(0, 2**64 - 1), ignore_eos=st.booleans(),
    prompt_commitments=st.none() | b32, top_logprobs=st.none() | st.integers(0, 20))
logprob_values = st.floats(max_value=0.0, allow_nan=False, allow_infinity=False)


@st.composite
def results(draw: st.DrawFn) -> ExecResult:
    tokens = tuple(draw(st.lists(u32, max_size=40)))
    lps = None
    if draw(st.booleans()):
        k = draw(st.integers(0, 20))
        lps = tuple((draw(logprob_values),
                     tuple(zip(draw(st.lists(u32, min_size=k, max_size=k, unique=True)),
                               draw(st.lists(logprob_values, min_size=k, max_size=k)),
                               strict=True)))
                    for _ in tokens)
    return ExecResult(output_token_ids=tokens,
                      finish_reason=draw(st.sampled_from(["stop", "length"])),
                      logit_digest=draw(b32), text_sha256=draw(b32), logprobs=lps)


def example_request(**over: Any) -> ExecRequest:
    kw: dict[str, Any] = dict(model_id=bytes(range(32)), tokenizer_hash=bytes(32),
                              engine_fingerprint='{"backend":"torch-cpu"}',
                              prompt_token_ids=(2, 651, 6037), max_tokens=16, temperature=0.7,
                              top_k=40, top_p=0.95, stop=("\n\n",), seed=42, ignore_eos=False)
    kw.update(over)
    return ExecRequest(**kw)


def example_result() -> ExecResult:
    return ExecResult(output_token_ids=(10, 11, 1), finish_reason="stop",
                      logit_digest=bytes(32), text_sha256=hashlib.sha256(b"hi").digest())


@settings(max_examples=60, deadline=None)
@given(st.one_of(requests, results()))
def test_round_trips(obj: ExecRequest | ExecResult) -> None:
    cls = type(obj)
    assert cls.from_canonical(obj.canonical) == obj
    assert cls.from_json(obj.to_json()) == obj
    assert obj.hash == hashlib.sha256(obj.canonical).digest()


def _flip(value: object, bit: int, pick: int) -> object:
    """``value`` with one bit of its representation flipped."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value ^ (1 << (bit % 64))
    if isinstance(value, float):
        (word,) = struct.unpack(">Q", struct.pack(">d", value))
        return struct.unpack(">d", struct.pack(">Q", word ^ (1 << (bit % 64))))[0]
    if isinstance(value, bytes):
        i = bit % (8 * len(value))
        return value[:i // 8] + bytes([value[i // 8] ^ (1 << (i % 8))]) + value[i // 8 + 1:]
    if isinstance(value, str):
        j = pick % len(value)
        return value[:j] + chr(ord(value[j]) ^ (1 << (bit % 16))) + value[j + 1:]
    assert isinstance(value, tuple) and value
    j = pick % len(value)
    return (*value[:j], _flip(value[j], bit, pick), *value[j + 1:])


@settings(max_examples=150, deadline=None)
@given(st.one_of(requests, results()), st.data())
def test_any_single_bit_change_changes_the_hash(obj: ExecRequest | ExecResult,
                                                data: st.DataObject) -> None:
    candidates = [f.name for f in fields(obj) if f.name != "version"
                  and getattr(obj, f.name) not in (None, (), "")]
    name = data.draw(st.sampled_from(candidates))
    bit, pick = data.draw(st.integers(0, 255)), data.draw(st.integers(0, 1000))
    if name == "finish_reason":
        changed: object = "length" if obj.finish_reason == "stop" else "stop"  # type: ignore[union-attr]
    else:
        changed = _flip(getattr(obj, name), bit, pick)
    try:
        kw: dict[str, Any] = {name: changed}
        other = replace(obj, **kw)
    except ReceiptFormatError:
        return  # the flip left the valid domain (e.g. a float became NaN): refused, not hashed
    if changed == -0.0 and getattr(obj, name) == 0.0:
        assert other.hash == obj.hash  # -0.0 is normalized: it samples exactly like 0.0
        return
    assert other.hash != obj.hash


def test_known_bytes_of_a_small_request() -> None:
    # Pins the documented encoding (docs/receipts.md reproduces this vector): a 14-entry map
    # (ae ...) with "top_logprobs" (here null).
    r = example_request(prompt_token_ids=(1, 2), stop=(), temperature=1.0, top_p=1.0)
    # 268 bytes; "top_logprobs" (12 bytes) sorts between "temperature" and "tokenizer_hash"
    assert r.canonical.hex() == (
        "ae6473656564182a6473746f708065746f705f6b182865746f705f70f93c006776657273696f6e02686d"
        "6f64656c5f69645820000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f6a"
        "69676e6f72655f656f73f46a6d61785f746f6b656e73106b74656d7065726174757265f93c006c746f70"
        "5f6c6f6770726f6273f66e746f6b656e697a65725f686173685820000000000000000000000000000000"
        "00000000000000000000000000000000007070726f6d70745f746f6b656e5f69647382010272656e6769"
        "6e655f66696e6765727072696e74777b226261636b656e64223a22746f7263682d637075227d7270726f"
        "6d70745f636f6d6d69746d656e7473f6")
    assert b"ltop_logprobs\x05" in replace(r, top_logprobs=5).canonical
    assert ExecRequest.from_canonical(r.canonical).version == 2
    # The same request as a development build wrote it (version 1, a 13-entry map without
    # "top_logprobs"): v1 never shipped, so its bytes are refused, by version, not decoded.
    v1_bytes = bytes.fromhex(
        "ad6473656564182a6473746f708065746f705f6b182865746f705f70f93c006776657273696f6e01686d"
        "6f64656c5f69645820000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f6a"
        "69676e6f72655f656f73f46a6d61785f746f6b656e73106b74656d7065726174757265f93c006e746f6b"
        "656e697a65725f6861736858200000000000000000000000000000000000000000000000000000000000"
        "0000007070726f6d70745f746f6b656e5f69647382010272656e67696e655f66696e6765727072696e74"
        "777b226261636b656e64223a22746f7263682d637075227d7270726f6d70745f636f6d6d69746d656e74"
        "73f6")
    v1_map = {k: v for k, v in r.as_map().items() if k != "top_logprobs"} | {"version": 1}
    assert cbor2.dumps(v1_map, canonical=True) == v1_bytes
    with pytest.raises(UnsupportedVersionError, match="version 1 is not supported") as e:
        ExecRequest.from_canonical(v1_bytes)
    assert e.value.code == "unsupported_version" and e.value.param == "version"
    with pytest.raises(UnsupportedVersionError, match="reads version 2 only"):
        replace(r, version=1)


def test_non_canonical_encodings_are_rejected() -> None:
    r = example_request()
    m = r.as_map()
    with pytest.raises(NonCanonicalEncodingError):  # insertion order instead of sorted keys
        ExecRequest.from_canonical(cbor2.dumps(m))
    with pytest.raises(NonCanonicalEncodingError):  # trailing byte
        ExecRequest.from_canonical(r.canonical + b"\x00")
    # top_p=1.0 encoded as a double instead of the shortest half float
    r1 = example_request(top_p=1.0)
    double = r1.canonical.replace(b"etop_p\xf9\x3c\x00", b"etop_p\xfb" + struct.pack(">d", 1.0))
    assert double != r1.canonical
    with pytest.raises(NonCanonicalEncodingError):
        ExecRequest.from_canonical(double)
    # seed 42 with a 4-byte head instead of 1 byte
    long_head = r.canonical.replace(b"dseed\x18\x2a", b"dseed\x1a\x00\x00\x00\x2a")
    assert long_head != r.canonical
    with pytest.raises(NonCanonicalEncodingError):
        ExecRequest.from_canonical(long_head)
    neg_zero = example_request(temperature=0.0).canonical.replace(
        b"ktemperature\xf9\x00\x00", b"ktemperature\xf9\x80\x00")
    with pytest.raises(NonCanonicalEncodingError):
        ExecRequest.from_canonical(neg_zero)


def test_bad_structures_raise_typed_errors() -> None:
    r = example_request()
    m = r.as_map()
    cases: list[tuple[dict[str, Any], type[Exception], str]] = [
        ({**m, "version": 3}, UnsupportedVersionError, "version 3"),
        ({**m, "version": 1}, UnsupportedVersionError, "version 1 is not supported"),
        ({k: v for k, v in m.items() if k != "top_logprobs"} | {"version": 1},
         UnsupportedVersionError, "version 1"),  # a development-build v1 map
        ({**m, "version": "2"}, UnsupportedVersionError, "'2'"),
        ({**m, "top_logprobs": 21}, ReceiptFormatError, "top_logprobs"),
        ({**m, "top_logprobs": -1}, ReceiptFormatError, "top_logprobs"),
        ({**m, "top_logprobs": True}, ReceiptFormatError, "top_logprobs"),
        ({**m, "top_logprobs": 2.0}, ReceiptFormatError, "top_logprobs"),
        ({**m, "extra": 1}, ReceiptFormatError, "keys must be exactly"),
        ({k: v for k, v in m.items() if k != "seed"}, ReceiptFormatError, "keys"),
        ({**m, "model_id": bytes(31)}, ReceiptFormatError, "model_id must be 32 bytes"),
        ({**m, "temperature": 1}, ReceiptFormatError, "finite float"),
        ({**m, "temperature": 2.5}, ReceiptFormatError, "2.5"),
        ({**m, "top_p": 0.0}, ReceiptFormatError, "top_p"),
        ({**m, "seed": 2**64}, ReceiptFormatError, "seed"),
        ({**m, "prompt_token_ids": []}, ReceiptFormatError, "empty"),
        ({**m, "prompt_token_ids": [1, -3]}, ReceiptFormatError, "-3"),
        ({**m, "prompt_token_ids": [1, True]}, ReceiptFormatError, "True"),
        ({**m, "stop": ["a", ""]}, ReceiptFormatError, "stop"),
        ({**m, "stop": ["a"] * 5}, ReceiptFormatError, "stop"),
        ({**m, "ignore_eos": 0}, ReceiptFormatError, "ignore_eos"),
        ({**m, "engine_fingerprint": ""}, ReceiptFormatError, "engine_fingerprint"),
    ]
    for bad, err, match in cases:
        with pytest.raises(err, match=match):
            ExecRequest.from_canonical(cbor2.dumps(bad, canonical=True))
    for junk in (b"", b"\xff", b"\x82\x01", cbor2.dumps([1, 2])):
        with pytest.raises(ReceiptFormatError):
            ExecRequest.from_canonical(junk)
    with pytest.raises(UnsupportedVersionError):
        ExecResult.from_canonical(cbor2.dumps({**example_result().as_map(), "version": 9},
                                              canonical=True))
    with pytest.raises(ReceiptFormatError, match="finish_reason"):
        replace(example_result(), finish_reason="eos")  # type: ignore[arg-type]


def test_json_view_rejects_bad_hex() -> None:
    j = example_request().to_json()
    assert ExecRequest.from_json({**j, "temperature": 1}).temperature == 1.0
    for field, value in (("model_id", "0x1234"), ("model_id", "ab" * 32),
                         ("tokenizer_hash", "0x" + "g" * 64), ("prompt_commitments", "0x00")):
        with pytest.raises(ReceiptFormatError, match=field):
            ExecRequest.from_json({**j, field: value})
    with pytest.raises(ReceiptFormatError, match="text_sha256"):
        ExecResult.from_json({**example_result().to_json(), "text_sha256": "0x" + "00" * 33})


def test_engine_mapping_reproduces_the_hashes(tiny_engine: Engine) -> None:
    params = SamplingParams(max_tokens=6, temperature=0.8, top_k=20, top_p=0.9, seed=7,
                            stop=("zz",))
    prompt = [5, 17, 33, 2]
    req = exec_request_for(tiny_engine, prompt, params)
    assert req.sampling_params() == params
    assert req.model_id == tiny_engine.model_id
    assert req.engine_fingerprint_hash == tiny_engine.fingerprint.hash
    gen = tiny_engine.generate(prompt, params)
    res = ExecResult.from_generation(gen)
    assert list(res.output_token_ids) == gen.token_ids and res.matches_text(gen.text)
    # a verifier re-executing from the decoded request reproduces out_hash exactly
    again = ExecRequest.from_canonical(req.canonical)
    replayed = ExecResult.from_generation(
        tiny_engine.generate(list(again.prompt_token_ids), again.sampling_params()))
    assert replayed.hash == res.hash
    with pytest.raises(Exception, match="vocabulary"):
        exec_request_for(tiny_engine, [10**7], params)


@settings(max_examples=30, deadline=None)
@given(requests, results(), st.integers(0, 2**64 - 1))
def test_any_valid_pair_signs_into_a_receipt(req: ExecRequest, res: ExecResult,
                                             epoch: int) -> None:
    signer = ReceiptSigner(hashlib.sha256(b"prop").digest())
    domain = Domain(31337, "0x5FbDB2315678afecb367f032d93F642f64180aa3")
    receipt = Receipt(operator=signer.address, chain_id=31337, model_id=req.model_id,
                      engine_fingerprint_hash=req.engine_fingerprint_hash, req_hash=req.hash,
                      out_hash=res.hash, key_epoch=epoch, ciphertext_hash=bytes(32), issued_at=0)
    sig = signer.sign(receipt, domain)
    assert verify_receipt(receipt, domain, sig, signer.address) == signer.address


# ---- logprobs (version 2) ---------------------------------------------------------------------
def _bits(x: float) -> int:
    return int.from_bytes(struct.pack(">d", x), "big")


def example_logprobs_result() -> ExecResult:
    # values that need every width: -0.5 fits a half float, -0.1 needs a double, a subnormal,
    # the most negative double, and -0.0 (the sign bit is committed too)
    return ExecResult(output_token_ids=(10, 11, 1), finish_reason="stop",
                      logit_digest=bytes(32), text_sha256=hashlib.sha256(b"hi").digest(),
                      logprobs=((-0.5, ((10, -0.5), (3, -1.25))),
                                (-0.1, ((7, -5e-324), (11, -0.1))),
                                (-1.7976931348623157e308, ((1, -0.0), (2, -3.0)))))


def test_logprobs_round_trip_bit_exactly_through_cbor_and_json() -> None:
    res = example_logprobs_result()
    back = ExecResult.from_canonical(res.canonical)
    assert back.hash == res.hash
    # JSON as a client or verifier reads it: through text, numbers printed and re-parsed
    again = ExecResult.from_json(json.loads(json.dumps(res.to_json())))
    assert again.hash == res.hash
    for a, b in ((res, back), (res, again)):
        assert a.logprobs is not None and b.logprobs is not None
        flat_a = [_bits(lp) for lp, top in a.logprobs for v in (lp, *(x for _, x in top))
                  for lp in (v,)]
        flat_b = [_bits(lp) for lp, top in b.logprobs for v in (lp, *(x for _, x in top))
                  for lp in (v,)]
        assert flat_a == flat_b
    # floats keep their shortest exact width: -0.5 is a half float (f9 b800)
    assert b"\xf9\xb8\x00" in res.canonical and b"\xfb" + struct.pack(">d", -0.1) in res.canonical
    # a JSON writer that prints -3.0 as -3 still gives the same committed value
    j = res.to_json()
    j["logprobs"][2][1][1][1] = -3
    assert ExecResult.from_json(j).hash == res.hash


@pytest.mark.parametrize("where", ["chosen", "alternative"])
def test_one_logprob_bit_changes_out_hash(where: str) -> None:
    res = example_logprobs_result()
    assert res.logprobs is not None
    lp, top = res.logprobs[1]
    if where == "chosen":
        entry = (struct.unpack(">d", struct.pack(">Q", _bits(lp) ^ 1))[0], top)
    else:
        (i0, v0), rest = top[0], top[1:]
        entry = (lp, ((i0, struct.unpack(">d", struct.pack(">Q", _bits(v0) ^ 1))[0]), *rest))
    forged = replace(res, logprobs=(res.logprobs[0], entry, res.logprobs[2]))
    assert forged.logprobs != res.logprobs and forged.hash != res.hash
    # ... and without logprobs it is yet another result
    assert replace(res, logprobs=None).hash not in (res.hash, forged.hash)


def test_bad_logprobs_raise_typed_errors() -> None:
    res = example_logprobs_result()
    assert res.logprobs is not None
    m = res.as_map()
    good = [list(e) for e in m["logprobs"]]
    cases: list[tuple[object, str]] = [
        (good[:2], "one entry per output token"),
        ([*good[:2], [0.5, []]], "<= 0"),  # a positive log-probability
        ([*good[:2], [float("-inf"), []]], "finite"),
        ([*good[:2], [-1, []]], "finite float"),  # an integer where the float belongs
        ([*good[:2], [-1.0, [[1, -1.0]]]], "alternatives"),  # another k than the first token
        ([*good[:2], [-1.0, [[1, -1.0], [1, -2.0]]]], "distinct"),
        ([*good[:2], [-1.0, [[-1, -1.0], [2, -2.0]]]], "u32"),
        ([*good[:2], [-1.0]], "logprob, top"),
        ([[-1.0, [[i, -1.0] for i in range(21)]]] * 3, "at most 20"),
    ]
    for bad, match in cases:
        with pytest.raises(ReceiptFormatError, match=match):
            ExecResult.from_canonical(cbor2.dumps({**m, "logprobs": bad}, canonical=True))
    # version 1 (no logprobs key) never shipped: refused by version, with or without the key
    v1_map = {k: v for k, v in m.items() if k != "logprobs"} | {"version": 1}
    for old in (v1_map, {**m, "version": 1}):
        with pytest.raises(UnsupportedVersionError, match="ExecResult version 1 is not supported"):
            ExecResult.from_canonical(cbor2.dumps(old, canonical=True))
    with pytest.raises(UnsupportedVersionError, match="version 1"):
        replace(res, logprobs=None, version=1)


def test_engine_logprobs_are_what_exec_result_commits(tiny_engine: Engine) -> None:
    params = SamplingParams(max_tokens=5, temperature=0.9, seed=3, ignore_eos=True)
    prompt = [5, 17, 33, 2]
    gen = tiny_engine.generate(prompt, params, top_logprobs=4)
    res = ExecResult.from_generation(gen)
    assert gen.logprobs is not None and res.logprobs is not None
    assert len(res.logprobs) == len(gen.token_ids) == 5
    for lp, (v, top) in zip(gen.logprobs, res.logprobs, strict=True):
        assert _bits(lp.logprob) == _bits(v) and lp.top == top and len(top) == 4
    req = exec_request_for(tiny_engine, prompt, params, top_logprobs=4)
    assert ExecRequest.from_canonical(req.canonical).top_logprobs == 4
    # a re-execution from the decoded request (decode, and replay) commits the same bytes
    again = tiny_engine.generate(prompt, req.sampling_params(), top_logprobs=req.top_logprobs)
    assert ExecResult.from_generation(again).hash == res.hash
    rr = tiny_engine.replay(prompt, gen.token_ids, params, top_logprobs=4)
    assert rr.matches and rr.logprobs == gen.logprobs
