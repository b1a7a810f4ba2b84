"""The one hex parser (verinfer.protocol.hexutil): what it accepts, what it refuses, and the
typed errors the formats above it see."""

from __future__ import annotations

import pytest

from verinfer.errors import InvalidRequestError
from verinfer.protocol.errors import ReceiptFormatError
from verinfer.protocol.fields import parse_hex as receipts_parse_hex
from verinfer.protocol.hexutil import HexFormatError, parse_hex, parse_hex_lenient, to_hex
from verinfer.verifier.votes import Verdict


def test_round_trip_and_length() -> None:
    raw = bytes(range(32))
    assert parse_hex(to_hex(raw), 32, "h") == raw
    assert parse_hex("0xABcd", None, "h") == b"\xab\xcd"
    assert parse_hex("0x", 0, "h") == b""


@pytest.mark.parametrize("value", [
    "1xabcd",        # bytes.fromhex(x[2:]) dropped any two leading characters
    "abcd",          # no prefix
    "0X" + "ab",     # upper-case prefix is not the format's spelling
    "0xab cd",       # bytes.fromhex accepts spaces between bytes
    " 0xabcd",
    "0xabc",         # half a byte
    "0xzz",
    "0x\u0661\u0662",  # non-ASCII digits
    None, 12, b"0xab",
])
def test_malformed_is_refused_with_the_field_named(value: object) -> None:
    with pytest.raises(HexFormatError) as e:
        parse_hex(value, None, "vote")
    assert e.value.param == "vote"
    # typed for the API edge (400) and still a ValueError for the handlers of bytes.fromhex
    assert isinstance(e.value, InvalidRequestError) and isinstance(e.value, ValueError)


def test_length_and_case_rules() -> None:
    with pytest.raises(HexFormatError, match="32 bytes"):
        parse_hex("0x" + "00" * 31, 32, "salt")
    with pytest.raises(HexFormatError, match="lower-case"):
        parse_hex("0xAB", 1, "root", lower_only=True)


def test_lenient_takes_either_prefix_but_nothing_else() -> None:
    key = "11" * 32
    assert parse_hex_lenient(key, 32, "KEY") == parse_hex_lenient("0x" + key, 32, "KEY")
    assert parse_hex_lenient("0X" + key, 32, "KEY") == bytes.fromhex(key)
    for bad in ("0x" + key[:-2], "zz" * 32, key + " ", None):
        with pytest.raises(HexFormatError):
            parse_hex_lenient(bad, 32, "KEY")


def test_receipts_see_their_own_error() -> None:
    with pytest.raises(ReceiptFormatError) as e:
        receipts_parse_hex("0x1", 32, "req_hash")
    assert e.value.param == "req_hash"


def test_a_saved_vote_with_a_bad_word_is_refused() -> None:
    good = Verdict(b"\x01" * 32, "match", b"\x01" * 32, 3, 0)
    d = good.to_json()
    assert Verdict.from_json(d) == good
    for field in ("vote", "receipt_out_hash"):
        with pytest.raises(HexFormatError):
            Verdict.from_json({**d, field: "1x" + "01" * 32})
