"""A few clients starve every honest completion by sending prompts of 262,000 spaces.

The operator tokenizes on one thread (``TOKENIZE_WORKERS``), first come first served, and
bounds a prompt only by characters (``MAX_PROMPT_CHARS`` = 256 Ki, "~4 us each"). Spaces are
the tokenizer's worst case (SentencePiece BPE merges them pairwise: ~20 us a character on the
tiny model), so one such prompt holds the tokenizer ~5 s — only to be refused afterwards, since
a prompt of 65,000 tokens never fits a 512-token window. Measured on `verinfer serve` (tiny
model, --max-context 512), six clients sending them in a loop: an honest 8-token completion
went from 15 ms (p50, quiet) to 12.2 s; /health stayed fast, so a load balancer saw nothing.

Fix (``ServingBase.refuse_unfittable``): no token covers more characters than the
vocabulary's longest piece, so a text of more than (window - 1) x 2 x longest-piece characters
cannot fit the server's window whatever its tokenization: it is refused (400
``context_length_exceeded``) by a length check before it reaches the tokenizer queue. The 2 is
a margin for normalizers that compose characters. And the request rule tokenizes a body's
prompts one at a time, refusing the first that does not fit before tokenizing the next: 16
prompts of 15,000 spaces (each under the length bound) were all tokenized, 1.8 s, before the
first was refused.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from support.servers import launched_server

ATTACK = {"model": "tiny", "prompt": " " * 262_000, "max_tokens": 1, "temperature": 0}
HONEST = {"model": "tiny", "prompt": "hello there", "max_tokens": 8, "temperature": 0}


@pytest.fixture(scope="module")
def base(tiny_path: Path) -> Iterator[str]:
    with launched_server(tiny_path, "--unsafe-no-evidence") as s:
        yield s.base


def test_unfittable_prompts_do_not_hold_the_tokenizer(base: str) -> None:
    with httpx.Client(base_url=base, timeout=60) as c:
        t0 = time.perf_counter()
        r = c.post("/v1/completions", json=ATTACK)
        one = time.perf_counter() - t0
        assert r.status_code == 400, r.text
        assert r.json()["error"]["code"] == "context_length_exceeded", r.text
        assert one < 1.0, f"one refused prompt took {one:.2f} s of the server"
        # sixteen prompts each just under the length bound: the first that does not fit is
        # refused before the others are tokenized (before: all 16, 1.8 s, then refused)
        t0 = time.perf_counter()
        r = c.post("/v1/completions", json={**ATTACK, "prompt": [" " * 15_000] * 16})
        sixteen = time.perf_counter() - t0
        assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"
        assert sixteen < 0.8, f"sixteen refused prompts took {sixteen:.2f} s of the server"

    stop = threading.Event()
    sent: list[int] = []

    def flood() -> None:
        with httpx.Client(base_url=base, timeout=60) as c:
            while not stop.is_set():
                sent.append(c.post("/v1/completions", json=ATTACK).status_code)

    threads = [threading.Thread(target=flood, daemon=True) for _ in range(4)]
    for t in threads:
        t.start()
    took: list[float] = []
    try:
        time.sleep(0.5)
        with httpx.Client(base_url=base, timeout=60) as c:
            for _ in range(8):
                t0 = time.perf_counter()
                assert c.post("/v1/completions", json=HONEST).status_code == 200
                took.append(time.perf_counter() - t0)
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=60)
    took.sort()
    print(f"honest completions under the flood: p50 {took[len(took) // 2] * 1000:.0f} ms, "
          f"max {took[-1] * 1000:.0f} ms; {len(sent)} attack requests")
    assert set(sent) <= {400}, sent
    assert took[len(took) // 2] < 1.0, took
