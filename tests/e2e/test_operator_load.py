"""Batch invariance through the whole operator: the same request gives the same bytes (text,
per-choice logit digest, req_hash, out_hash) alone and while 16 other clients — sync and async
official openai SDK clients — send prompts of other lengths, sampling options and endpoints.

The probe request is sent from several threads at once so it also lands in different batch
rows and alongside copies of itself.
"""

from __future__ import annotations

import asyncio
import random
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import openai
from openai import OpenAI
from openai.types.chat import ChatCompletionMessageParam

PROBE_MESSAGES: list[ChatCompletionMessageParam] = [
    {"role": "user", "content": "the quick brown fox jumps over"}]
PROBE_MAX_TOKENS = 6
REPEATS = 100
STREAM_REPEATS = 20
PROBE_SENDERS = 4
SYNC_NOISE_CLIENTS = 8
ASYNC_NOISE_CLIENTS = 8
WORDS = ("alpha", "beta", "gamma", "delta", "sea", "river", "cloud", "stone", "light", "dark",
         "quick", "slow", "red", "blue", "tree", "house", "road", "wind", "fire", "water")


@dataclass(frozen=True)
class Fingerprint:
    """Everything that must be bit-identical between two runs of the same request."""

    contents: tuple[str, ...]
    logit_digests: tuple[str, ...]
    req_hash: str
    out_hash: str
    seed: int


def fingerprint(r: Any) -> Fingerprint:
    v = (r.model_extra or {})["verification"]
    return Fingerprint(
        contents=tuple(c.message.content or "" for c in r.choices),
        logit_digests=tuple((c.model_extra or {})["verinfer"]["logit_digest"]
                            for c in r.choices),
        req_hash=v["req_hash"], out_hash=v["out_hash"], seed=v["seed"])


def noise_request(rng: random.Random) -> dict[str, Any]:
    """Another client's request: prompt length, decode options, n and endpoint vary."""
    prompt = " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 40)))
    kw: dict[str, Any] = {"model": "tiny", "max_tokens": rng.randint(1, 10),
                          "temperature": rng.choice([0.0, 0.5, 1.0, 1.3])}
    if rng.random() < 0.5:
        kw["seed"] = rng.randrange(2**32)
    if rng.random() < 0.2:
        kw["n"] = 2
    if rng.random() < 0.3:
        kw["top_p"] = 0.9
    if rng.random() < 0.3:
        return {"endpoint": "completions", "prompt": prompt, **kw}
    return {"endpoint": "chat", "messages": [{"role": "user", "content": prompt}], **kw}


def _send_sync(client: OpenAI, req: dict[str, Any]) -> None:
    kw = {k: v for k, v in req.items() if k != "endpoint"}
    if req["endpoint"] == "chat":
        client.chat.completions.create(**kw)
    else:
        client.completions.create(**kw)


async def _send_async(client: openai.AsyncOpenAI, req: dict[str, Any]) -> None:
    kw = {k: v for k, v in req.items() if k != "endpoint"}
    if req["endpoint"] == "chat":
        await client.chat.completions.create(**kw)
    else:
        await client.completions.create(**kw)


@contextmanager
def background_load(server: str) -> Iterator[Callable[[], int]]:
    """Runs 16 noise clients (8 sync threads, 8 asyncio tasks) until the block ends; yields a
    function returning how many noise requests completed. Any noise failure fails the test."""
    stop = threading.Event()
    done = [0]
    lock = threading.Lock()
    errors: list[BaseException] = []

    def count() -> None:
        with lock:
            done[0] += 1

    def sync_worker(i: int) -> None:
        client = OpenAI(base_url=server + "/v1", api_key="unused", max_retries=0, timeout=60)
        rng = random.Random(1000 + i)
        try:
            while not stop.is_set():
                _send_sync(client, noise_request(rng))
                count()
        except BaseException as e:  # surfaced in the main thread
            errors.append(e)
        finally:
            client.close()

    def async_workers() -> None:
        async def worker(client: openai.AsyncOpenAI, i: int) -> None:
            rng = random.Random(2000 + i)
            while not stop.is_set():
                await _send_async(client, noise_request(rng))
                count()

        async def main() -> None:
            client = openai.AsyncOpenAI(base_url=server + "/v1", api_key="unused",
                                        max_retries=0, timeout=60)
            try:
                await asyncio.gather(*[worker(client, i) for i in range(ASYNC_NOISE_CLIENTS)])
            finally:
                await client.close()

        try:
            asyncio.run(main())
        except BaseException as e:  # surfaced in the main thread
            errors.append(e)

    threads = [threading.Thread(target=sync_worker, args=(i,), daemon=True)
               for i in range(SYNC_NOISE_CLIENTS)]
    threads.append(threading.Thread(target=async_workers, daemon=True))
    for t in threads:
        t.start()
    try:
        yield lambda: done[0]
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=60)
    assert not errors, f"noise clients failed: {errors[:3]!r}"
    assert not any(t.is_alive() for t in threads), "a noise client hung"


def probe_under_load(server: str, client: OpenAI, **options: Any) -> None:
    alone = fingerprint(client.chat.completions.create(
        model="tiny", messages=PROBE_MESSAGES, max_tokens=PROBE_MAX_TOKENS, **options))
    with background_load(server) as noise_done:
        def send(_: int) -> Fingerprint:
            return fingerprint(client.chat.completions.create(
                model="tiny", messages=PROBE_MESSAGES, max_tokens=PROBE_MAX_TOKENS,
                **options))

        with ThreadPoolExecutor(PROBE_SENDERS) as pool:
            seen = list(pool.map(send, range(REPEATS)))
        noise = noise_done()
    assert len(seen) == REPEATS
    differing = [i for i, f in enumerate(seen) if f != alone]
    assert not differing, f"{len(differing)} of {REPEATS} differ, e.g. {seen[differing[0]]} " \
                          f"vs alone {alone}"
    assert alone.contents[0], "the probe produced no text: nothing was compared"
    # The probes really ran beside other traffic, not before or after it.
    assert noise >= REPEATS // 2, f"only {noise} noise requests ran during the probes"


def test_greedy_probe_is_identical_under_load(server: str, client: OpenAI) -> None:
    probe_under_load(server, client, temperature=0)


def test_seeded_sampled_probe_is_identical_under_load(server: str, client: OpenAI) -> None:
    probe_under_load(server, client, temperature=0.8, seed=1234)


def test_streamed_probe_reassembles_to_the_same_bytes_under_load(server: str,
                                                                 client: OpenAI) -> None:
    whole = fingerprint(client.chat.completions.create(
        model="tiny", messages=PROBE_MESSAGES, max_tokens=PROBE_MAX_TOKENS, temperature=0.8,
        seed=77))

    def stream_once(_: int) -> tuple[str, str, str, str]:
        chunks = list(client.chat.completions.create(
            model="tiny", messages=PROBE_MESSAGES, max_tokens=PROBE_MAX_TOKENS, temperature=0.8,
            seed=77, stream=True))
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        finish = [c for c in chunks if c.choices and c.choices[0].finish_reason]
        digest = (finish[-1].choices[0].model_extra or {})["verinfer"]["logit_digest"]
        v = (chunks[-1].model_extra or {})["verification"]
        return text, digest, v["req_hash"], v["out_hash"]

    with background_load(server), ThreadPoolExecutor(PROBE_SENDERS) as pool:
        seen = list(pool.map(stream_once, range(STREAM_REPEATS)))
    expected = (whole.contents[0], whole.logit_digests[0], whole.req_hash, whole.out_hash)
    assert all(s == expected for s in seen), [s for s in seen if s != expected][:2]
