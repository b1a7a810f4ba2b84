"""The request rule's shape bound (limits.MAX_BODY_CONTAINERS / MAX_BODY_VALUES), counted on the
raw bytes: strings do not count, the rule refuses past the bounds (so a verifier judges a
receipt for such a body nonconformant), and the largest legitimate bodies stay inside them."""

from __future__ import annotations

import json

import pytest

from verinfer.errors import InvalidRequestError
from verinfer.protocol import limits as L
from verinfer.protocol.jsonsafe import json_shape
from verinfer.protocol.request_rule import check_body_shape, parse_body


def test_strings_do_not_count() -> None:
    assert json_shape(rb'{"a":"[[[{{,,,\"]]"}', 99) == (2, 1, 2)
    assert json_shape(b"[1,2,[3]]", 99) == (0, 2, 5)  # 4 values + the root, bounded above
    assert json_shape(b"7", 99) == (0, 0, 1)


@pytest.mark.parametrize(("text", "strings"), [
    (rb'["\\", "x"]', 2),  # an escaped backslash ends its string
    (rb'["\\\"", "x"]', 2),  # escaped backslash, escaped quote
    (rb'["\"[,]\"", 1]', 1),  # escaped quotes around brackets stay inside
    (rb'["\u005c", ","]', 2),
])
def test_escapes_are_read_as_json_reads_them(text: bytes, strings: int) -> None:
    assert json_shape(text, 99)[0] == strings == len([v for v in json.loads(text)
                                                      if isinstance(v, str)])
    assert json_shape(text, 99)[1] == 1


def test_many_strings_stop_the_count_early() -> None:
    body = json.dumps(["a"] * (L.MAX_BODY_STRINGS + 1)).encode()
    assert json_shape(body, L.MAX_BODY_STRINGS) == (L.MAX_BODY_STRINGS + 1, -1, -1)
    with pytest.raises(InvalidRequestError, match="strings"):
        check_body_shape(body)


def _completion(prompt: object) -> bytes:
    return json.dumps({"model": "m", "prompt": prompt}, separators=(",", ":")).encode()


def test_too_many_lists_are_refused_by_the_rule() -> None:
    body = _completion([[1]] * L.MAX_BODY_CONTAINERS)
    with pytest.raises(InvalidRequestError, match="arrays and objects"):
        parse_body(body, "completions")


def test_too_many_token_ids_are_refused_by_the_rule() -> None:
    body = _completion([1] * (L.MAX_BODY_VALUES + 1))
    with pytest.raises(InvalidRequestError, match="values"):
        parse_body(body, "completions")


def test_the_largest_legitimate_bodies_fit() -> None:
    chat = {"model": "m", "max_tokens": 3, "stop": ["a", "b", "c", "d"], "n": 8,
            "stream": True, "stream_options": {"include_usage": True}, "logit_bias": {},
            "messages": [{"role": "user", "content": "x, [y], {z}", "name": "n"}] * 256}
    raw = json.dumps(chat).encode()
    check_body_shape(raw)
    assert len(parse_body(raw, "chat").messages or ()) == 256
    ids = _completion([[5] * (L.MAX_BODY_VALUES // 16 - 8)] * 16)
    check_body_shape(ids)
    assert len(parse_body(ids, "completions").prompts) == 16
