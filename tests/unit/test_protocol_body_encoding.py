"""Both sides of a dispute refuse the same non-UTF-8 bodies (issue 32.3): the request rule's
``load_body`` (the verifier's parse), ``check_body_shape`` (the operator's edge) and
``loads_untrusted`` refuse UTF-16, UTF-32 and a UTF-8 byte order mark, fast, whatever the
body hides; UTF-8 is accepted as before."""

from __future__ import annotations

import json
import time

import pytest

from verinfer.protocol.jsonsafe import UntrustedJsonError, loads_untrusted, require_utf8
from verinfer.protocol.request_rule import check_body_shape, load_body

CHAT = {"model": "m", "messages": [{"role": "user", "content": "h\u00e9llo \u5c41"}]}
ENCODINGS = ["utf-16-le", "utf-16-be", "utf-16", "utf-32-le", "utf-32-be", "utf-32",
             "utf-8-sig"]


@pytest.mark.parametrize("encoding", ENCODINGS)
def test_every_parser_of_a_body_refuses_other_encodings(encoding: str) -> None:
    body = json.dumps(CHAT, ensure_ascii=False).encode(encoding)
    assert json.loads(body) == CHAT  # the stdlib alone would read it
    for parse in (load_body, check_body_shape, loads_untrusted, require_utf8):
        with pytest.raises(UntrustedJsonError, match="UTF-8") as e:
            parse(body)
        assert e.value.code == "invalid_json" and e.value.status_code == 400


def test_utf8_bodies_are_read_as_before() -> None:
    body = json.dumps(CHAT, ensure_ascii=False).encode()
    assert load_body(body) == CHAT and loads_untrusted(body) == CHAT
    check_body_shape(body)
    assert loads_untrusted(json.dumps(CHAT)) == CHAT  # text handed in: already decoded


def test_invalid_utf8_and_encoded_surrogates_are_refused() -> None:
    for bad in (b'{"a": "\xff"}', b'{"a": "\xed\xa0\x80"}', b'{"a": "\xc3"}'):
        with pytest.raises(UntrustedJsonError, match="not UTF-8"):
            load_body(bad)


def test_the_hidden_structure_body_is_refused_in_milliseconds() -> None:
    text = json.dumps({"model": "m", "user": "\u5c41", "stop": [[[1, 2]] * 200_000]},
                      ensure_ascii=False).replace('"\u5c41"', '"\u5c41\u5c41"')
    body = text.encode("utf-16-le")
    t0 = time.perf_counter()
    with pytest.raises(UntrustedJsonError):
        load_body(body)
    assert time.perf_counter() - t0 < 0.5
