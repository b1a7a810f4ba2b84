"""The HPKE envelope: opens only with the right epoch key under the right receipt; every
failure to open is the one opaque error. Both suites."""

from __future__ import annotations

import hashlib
from dataclasses import replace

import cbor2
import pytest

from verinfer.protocol.errors import ReceiptFormatError, UnsupportedVersionError
from verinfer.protocol.exec_request import ExecRequest
from verinfer.receipts.canonical import ExecResult
from verinfer.receipts.eip712 import Receipt, address_of
from verinfer.receipts.envelope import (
    HEADER_LEN,
    EnvelopeBinding,
    EnvelopeContents,
    ciphertext_hash,
    open_envelope,
    padme,
    seal,
)
from verinfer.receipts.epoch_keys import EnvelopeSuite, derive_epoch_keypair
from verinfer.receipts.errors import EnvelopeContentError, EnvelopeDecryptionError

OPERATOR = address_of(hashlib.sha256(b"op").digest())
REQ = ExecRequest(model_id=bytes(range(32)), tokenizer_hash=bytes(32), engine_fingerprint="{}",
                  prompt_token_ids=(1, 2, 3), max_tokens=8, temperature=0.0, top_k=0,
                  top_p=1.0, stop=(), seed=1, ignore_eos=False)
RES = ExecResult(output_token_ids=(4, 5), finish_reason="length", logit_digest=bytes(32),
                 text_sha256=hashlib.sha256(b"ab").digest())
CONTENTS = EnvelopeContents(REQ, RES, b'{"model":"m","messages":[]}', b'{"choices":[]}')
SUITES = list(EnvelopeSuite)


def sealed(suite: EnvelopeSuite, epoch: int = 4) -> tuple[bytes, Receipt]:
    _, pk = derive_epoch_keypair(b"\x11" * 32, suite)
    binding = EnvelopeBinding.for_execution(operator=OPERATOR, chain_id=31337, key_epoch=epoch,
                                            request=REQ, result=RES)
    blob = seal(CONTENTS, binding, pk)
    receipt = Receipt(operator=OPERATOR, chain_id=31337, model_id=REQ.model_id,
                      engine_fingerprint_hash=REQ.engine_fingerprint_hash, req_hash=REQ.hash,
                      out_hash=RES.hash, key_epoch=epoch, ciphertext_hash=ciphertext_hash(blob),
                      issued_at=1_700_000_000)
    return blob, receipt


@pytest.mark.parametrize("suite", SUITES)
def test_opens_with_the_epoch_key(suite: EnvelopeSuite) -> None:
    blob, receipt = sealed(suite)
    sk, _ = derive_epoch_keypair(b"\x11" * 32, suite)
    assert open_envelope(blob, receipt, sk) == CONTENTS
    assert open_envelope(blob, EnvelopeBinding.from_receipt(receipt), sk) == CONTENTS
    assert blob[HEADER_LEN:].find(b"messages") == -1  # actually encrypted


@pytest.mark.parametrize("suite", SUITES)
def test_every_failure_is_the_same_opaque_error(suite: EnvelopeSuite) -> None:
    blob, receipt = sealed(suite)
    sk, _ = derive_epoch_keypair(b"\x11" * 32, suite)
    wrong_key, _ = derive_epoch_keypair(b"\x22" * 32, suite)
    other_suite_key, _ = derive_epoch_keypair(
        b"\x11" * 32, next(s for s in SUITES if s is not suite))
    binding = EnvelopeBinding.from_receipt(receipt)
    attempts: list[tuple[bytes, Receipt | EnvelopeBinding, object]] = [
        (blob, receipt, wrong_key),
        (blob, receipt, other_suite_key),
        (blob[:-1], binding, sk),  # truncated
        (blob[:HEADER_LEN], binding, sk),
        (b"", binding, sk),
        (blob + b"\x00", binding, sk),  # extended
        (blob, replace(receipt, key_epoch=5), sk),  # different epoch
    ]
    # moved under another receipt: same blob, each bound field changed in turn
    for field, value in (("req_hash", b"\x01" * 32), ("out_hash", b"\x02" * 32),
                         ("model_id", b"\x03" * 32), ("engine_fingerprint_hash", b"\x04" * 32),
                         ("chain_id", 1), ("key_epoch", 5),
                         ("operator", address_of(b"\x05" * 32))):
        attempts.append((blob, replace(binding, **{field: value}), sk))
        attempts.append((blob, replace(receipt, **{field: value}), sk))
    # a bit flip anywhere: header, encapsulated key, ciphertext, tag
    for pos in (0, 4, 6, HEADER_LEN, HEADER_LEN + 40, len(blob) // 2, len(blob) - 1):
        flipped = blob[:pos] + bytes([blob[pos] ^ 0x10]) + blob[pos + 1:]
        attempts.append((flipped, binding, sk))
        attempts.append((flipped, replace(receipt, ciphertext_hash=ciphertext_hash(flipped)), sk))
    for bad_blob, bound, key in attempts:
        with pytest.raises(EnvelopeDecryptionError) as exc:
            open_envelope(bad_blob, bound, key)  # type: ignore[arg-type]
        assert exc.value.message == "the envelope could not be opened"
        e = exc.value  # no chained cause that could tell the failures apart
        assert e.__cause__ is None and (e.__context__ is None or e.__suppress_context__)


def test_seal_refuses_contents_that_do_not_match_the_binding() -> None:
    _, pk = derive_epoch_keypair(b"\x11" * 32)
    binding = EnvelopeBinding.for_execution(operator=OPERATOR, chain_id=1, key_epoch=1,
                                            request=REQ, result=RES)
    other = replace(RES, finish_reason="stop")
    with pytest.raises(ReceiptFormatError, match="out_hash"):
        seal(replace(CONTENTS, result=other), binding, pk)


def test_a_dishonest_sealer_is_caught_as_content_mismatch() -> None:
    """Contents sealed under a binding that names other hashes open, but are evidence."""
    from verinfer.receipts import envelope as env

    sk, pk = derive_epoch_keypair(b"\x11" * 32)
    lie = EnvelopeBinding.for_execution(operator=OPERATOR, chain_id=1, key_epoch=1,
                                        request=REQ, result=replace(RES, finish_reason="stop"))
    suite = pk.suite
    header = env.MAGIC + bytes([env.SUITE_CODES[suite]]) + (1).to_bytes(8, "big")
    blob = header + suite.hpke.encrypt(CONTENTS.to_bytes(), pk.hpke, lie.info(suite))
    with pytest.raises(EnvelopeContentError, match="out_hash"):
        open_envelope(blob, lie, sk)
    garbage = header + suite.hpke.encrypt(b"\xa0", pk.hpke, lie.info(suite))
    with pytest.raises(EnvelopeContentError, match="malformed"):
        open_envelope(garbage, lie, sk)


def test_plaintext_round_trip_is_strict() -> None:
    data = CONTENTS.to_bytes()
    assert EnvelopeContents.from_bytes(data) == CONTENTS
    with pytest.raises(ReceiptFormatError):
        EnvelopeContents.from_bytes(data + b"\x00")
    with pytest.raises(ReceiptFormatError):
        EnvelopeContents.from_bytes(data[:-3])
    m = cbor2.loads(data)
    with pytest.raises(UnsupportedVersionError, match="version 3"):
        EnvelopeContents.from_bytes(cbor2.dumps({**m, "version": 3}, canonical=True))
    with pytest.raises(ReceiptFormatError, match="not canonically"):
        EnvelopeContents.from_bytes(cbor2.dumps(dict(reversed(m.items()))))  # unsorted keys


def test_plaintext_is_padded_to_a_padme_length() -> None:
    for body in (b"", b"x" * 10, b"y" * 1000, b"z" * 70_000):
        data = replace(CONTENTS, response_body=body).to_bytes()
        assert padme(len(data)) == len(data)
        m = cbor2.loads(data)
        assert set(m["padding"]) <= {0}
        assert EnvelopeContents.from_bytes(data).response_body == body


def test_bodies_of_nearby_sizes_give_ciphertexts_of_one_size() -> None:
    _, pk = derive_epoch_keypair(b"\x11" * 32, EnvelopeSuite.X25519)
    sizes = set()
    for n in (3000, 3010, 3050):
        contents = replace(CONTENTS, response_body=b"r" * n)
        binding = EnvelopeBinding.for_execution(operator=OPERATOR, chain_id=1, key_epoch=1,
                                                request=REQ, result=RES)
        sizes.add(len(seal(contents, binding, pk)))
    assert len(sizes) == 1


def test_padding_must_be_the_rules_zero_bytes() -> None:
    m = cbor2.loads(CONTENTS.to_bytes())
    pad = m["padding"]
    bad_bytes = {**m, "padding": b"\x01" + pad[1:]} if pad else {**m, "padding": b"\x01"}
    for bad in (bad_bytes, {**m, "padding": pad + b"\x00" * 40}):
        with pytest.raises(ReceiptFormatError, match="padding"):
            EnvelopeContents.from_bytes(cbor2.dumps(bad, canonical=True))


def test_a_version_1_or_unpadded_plaintext_is_refused() -> None:
    """Version 1 (no padding) never shipped: refused by its version, and a version-2 map
    without padding is malformed (no second parser for an older shape)."""
    m = cbor2.loads(CONTENTS.to_bytes())
    del m["padding"]
    with pytest.raises(ReceiptFormatError, match="keys"):
        EnvelopeContents.from_bytes(cbor2.dumps(m, canonical=True))
    with pytest.raises(UnsupportedVersionError, match="version 1"):
        EnvelopeContents.from_bytes(cbor2.dumps({**m, "version": 1}, canonical=True))


@pytest.mark.parametrize(("length", "want"), [(0, 0), (9, 10), (100, 104), (1000, 1024),
                                              (1025, 1088), (1_000_000, 1_015_808)])
def test_padme_rounds_up_with_bounded_overhead(length: int, want: int) -> None:
    assert padme(length) == want
    assert padme(length) <= length * 1.12 + 1
