"""A UTF-16 body froze the operator's API (issue 32.3).

The attack: a chat body encoded as UTF-16 (or UTF-32). The stdlib decoder reads it (it guesses
the encoding from the first bytes), but the shape bound before it (``json_shape``, the nesting
scan) reads bytes as UTF-8, where ASCII bytes are always characters. In UTF-16 they are not:
U+5C41 is the bytes ``41 5C`` (LE), and that ``5C`` reads as a backslash, so the quote after
it looks escaped and whole strings of brackets and commas vanish from the count. A body the
scan called small parsed and validated for 20-58 s on the event loop; nothing else was served.

Fix: bodies are UTF-8 (RFC 8259 section 8.1), byte order mark included in what is refused:
``verinfer.protocol.jsonsafe.require_utf8``, applied by the request rule's
``check_body_shape`` (the operator's edge and the verifier's ``load_body`` alike) and by
``loads_untrusted``. Each encoding below is answered 400 in OpenAI's shape, at once.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import httpx
import pytest

from support.inproc import serving
from verinfer.engine.engine import Engine
from verinfer.httpserve import ServeLimits
from verinfer.operator.app import ServerConfig, create_app

LIMITS = ServeLimits(max_body_bytes=4 * 1024 * 1024)
CHAT = {"model": "tiny", "max_tokens": 2, "temperature": 0,
        "messages": [{"role": "user", "content": "hi"}]}
# the finding's shape: U+5C41 before every closing quote hides the structure from a UTF-8 scan
HIDDEN = json.dumps({**CHAT, "user": "\u5c41", "stop": [[[1, 2]] * 40_000]},
                    ensure_ascii=False).replace('"\u5c41"', '"\u5c41\u5c41"')
ENCODINGS = ["utf-16-le", "utf-16-be", "utf-16", "utf-32-le", "utf-32-be", "utf-32",
             "utf-8-sig"]


@pytest.fixture(scope="module")
def base(tiny_engine: Engine) -> Iterator[str]:
    app = create_app(tiny_engine, "tiny", ServerConfig(http_limits=LIMITS))
    with serving(app, LIMITS) as (host, port):
        yield f"http://{host}:{port}"


@pytest.mark.parametrize("encoding", ENCODINGS)
@pytest.mark.parametrize("text", [json.dumps(CHAT), HIDDEN], ids=["plain", "hidden"])
def test_a_body_not_in_utf8_is_400_at_once(base: str, encoding: str, text: str) -> None:
    body = text.encode(encoding)
    with httpx.Client(base_url=base, timeout=30) as c:
        t0 = time.monotonic()
        r = c.post("/v1/chat/completions", content=body,
                   headers={"Content-Type": "application/json"})
        took = time.monotonic() - t0
        assert r.status_code == 400, r.text[:300]
        err = r.json()["error"]
        assert err["type"] == "invalid_request_error" and err["code"] == "invalid_json"
        assert "UTF-8" in err["message"]
        assert took < 1.0, took
        # the server is not busy with it: the next request is served as before
        assert c.post("/v1/chat/completions", json=CHAT).status_code == 200
