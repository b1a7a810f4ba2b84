"""ExecRequest / ExecResult: canonical CBOR round trips, strict decoding, and engine mapping."""

from __future__ import annotations

import hashlib
import struct
from dataclasses import fields, replace
from typing import Any

import cbor2
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from verinfer.engine.engine import Engine
from verinfer.engine.sampling import SamplingParams
from verinfer.receipts.canonical import ExecRequest, ExecResult
from verinfer.receipts.eip712 import Domain, Receipt, ReceiptSigner, verify_receipt
from verinfer.receipts.errors import (
    NonCanonicalEncodingError,
    ReceiptFormatError,
    UnsupportedVersionError,
)

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
    prompt_commitments=st.none() | b32)
results = st.builds(
    ExecResult, output_token_ids=st.lists(u32, max_size=40).map(tuple),
    finish_reason=st.sampled_from(["stop", "length"]), logit_digest=b32, text_sha256=b32)


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
@given(st.one_of(requests, results))
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
@given(st.one_of(requests, results), st.data())
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
        other = replace(obj, **{name: changed})
    except ReceiptFormatError:
        return  # the flip left the valid domain (e.g. a float became NaN): refused, not hashed
    if changed == -0.0 and getattr(obj, name) == 0.0:
        assert other.hash == obj.hash  # -0.0 is normalized: it samples exactly like 0.0
        return
    assert other.hash != obj.hash


def test_known_bytes_of_a_small_request() -> None:
    # Pins the documented encoding (docs/receipts.md reproduces this vector).
    r = example_request(prompt_token_ids=(1, 2), stop=(), temperature=1.0, top_p=1.0)
    # 13-entry map; keys shortest-first; seed 42 -> 18 2a; 1.0 -> half float f9 3c00.
    assert r.canonical.hex() == (
        "ad6473656564182a6473746f708065746f705f6b182865746f705f70f93c006776657273696f6e01686d"
        "6f64656c5f69645820000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f6a"
        "69676e6f72655f656f73f46a6d61785f746f6b656e73106b74656d7065726174757265f93c006e746f6b"
        "656e697a65725f6861736858200000000000000000000000000000000000000000000000000000000000"
        "0000007070726f6d70745f746f6b656e5f69647382010272656e67696e655f66696e6765727072696e74"
        "777b226261636b656e64223a22746f7263682d637075227d7270726f6d70745f636f6d6d69746d656e74"
        "73f6")


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
        ({**m, "version": 2}, UnsupportedVersionError, "version 2"),
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
    req = ExecRequest.from_engine(tiny_engine, prompt, params)
    assert req.sampling_params() == params
    assert req.model_id.hex() == tiny_engine.model_id[2:]
    assert "0x" + req.engine_fingerprint_hash.hex() == tiny_engine.fingerprint.hash
    gen = tiny_engine.generate(prompt, params)
    res = ExecResult.from_generation(gen)
    assert list(res.output_token_ids) == gen.token_ids and res.matches_text(gen.text)
    # a verifier re-executing from the decoded request reproduces out_hash exactly
    again = ExecRequest.from_canonical(req.canonical)
    replayed = ExecResult.from_generation(
        tiny_engine.generate(list(again.prompt_token_ids), again.sampling_params()))
    assert replayed.hash == res.hash
    with pytest.raises(Exception, match="vocabulary"):
        ExecRequest.from_engine(tiny_engine, [10**7], params)


@settings(max_examples=30, deadline=None)
@given(requests, results, st.integers(0, 2**64 - 1))
def test_any_valid_pair_signs_into_a_receipt(req: ExecRequest, res: ExecResult,
                                             epoch: int) -> None:
    signer = ReceiptSigner(hashlib.sha256(b"prop").digest())
    domain = Domain(31337, "0x5FbDB2315678afecb367f032d93F642f64180aa3")
    receipt = Receipt(operator=signer.address, chain_id=31337, model_id=req.model_id,
                      engine_fingerprint_hash=req.engine_fingerprint_hash, req_hash=req.hash,
                      out_hash=res.hash, key_epoch=epoch, ciphertext_hash=bytes(32), issued_at=0)
    sig = signer.sign(receipt, domain)
    assert verify_receipt(receipt, domain, sig, signer.address) == signer.address
