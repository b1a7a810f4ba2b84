"""A user freezes the operator's event loop with a 4 MiB body of tiny JSON values.

The earlier fix (test_operator_server.py) moved tokenizing off the event loop and bounded the
prompt's characters; a body can still be costly *before* any of that: FastAPI parses it and
pydantic validates it on the event loop, and a 4 MiB body holding a million one-element lists
(``"prompt": [[1],[1],...]``), two million token ids or a million one-letter strings costs
seconds there (json.loads builds a
million lists; the JsonInt validator is a Python call per id). While it runs nothing else is
served: streams stall and /health times out (a load balancer then drops the operator). Who
gains: a competitor or a griefer, for one request per few seconds.

Fix (one home: ``verinfer.protocol.jsonsafe.json_shape`` and the limits table): a body may hold
at most ``MAX_BODY_STRINGS`` strings, ``MAX_BODY_CONTAINERS`` arrays/objects and
``MAX_BODY_VALUES`` values. The request rule refuses bodies past them (both sides of a dispute),
and the operator checks the same bound on the raw bytes before parsing (C-speed byte counts, no
regex), answering 400.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from support.servers import Server, launched_server, operator_init

HEAD = {"model": "tiny", "max_tokens": 2, "temperature": 0}
LISTS = json.dumps({**HEAD, "prompt": [[1]] * 1_000_000}, separators=(",", ":"))
IDS = json.dumps({**HEAD, "prompt": [1] * 1_990_000}, separators=(",", ":"))
STRINGS = json.dumps({**HEAD, "prompt": ["a"] * 950_000}, separators=(",", ":"))


@pytest.fixture(scope="module")
def server(tiny_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    d = tmp_path_factory.mktemp("op-shape")
    operator_init(d / "op")
    with launched_server(tiny_path, "--operator-dir", str(d / "op")) as s:
        yield s


def test_tiny_value_bombs_do_not_freeze_the_event_loop(server: Server) -> None:
    assert all(len(b) < 4 * 1024 * 1024 for b in (LISTS, IDS, STRINGS))
    stop = threading.Event()
    statuses: list[int] = []
    took: list[float] = []

    def flood(body: str) -> None:
        with httpx.Client(timeout=120) as c:
            while not stop.is_set():
                t0 = time.perf_counter()
                r = c.post(server.base + "/v1/completions", content=body,
                           headers={"Content-Type": "application/json"})
                took.append(time.perf_counter() - t0)
                statuses.append(r.status_code)

    threads = [threading.Thread(target=flood, args=(b,), daemon=True)
               for b in (LISTS, IDS, STRINGS)]
    for t in threads:
        t.start()
    time.sleep(1.0)
    lat = []
    with httpx.Client(base_url=server.base, timeout=30) as c:
        for _ in range(100):
            t0 = time.perf_counter()
            assert c.get("/health").status_code == 200
            lat.append(time.perf_counter() - t0)
            time.sleep(0.02)
    stop.set()
    for t in threads:
        t.join(timeout=120)
    lat.sort()
    p99 = lat[int(len(lat) * 0.99) - 1]
    print(f"/health under flood: p50 {lat[len(lat) // 2] * 1000:.1f} ms, p99 {p99 * 1000:.1f} "
          f"ms, max {lat[-1] * 1000:.1f} ms; {len(statuses)} bombs, median answer "
          f"{sorted(took)[len(took) // 2] * 1000:.0f} ms")
    assert statuses and set(statuses) == {400}, set(statuses)
    assert p99 < 1.0, f"/health p99 {p99 * 1000:.1f} ms (max {lat[-1] * 1000:.1f} ms)"


def test_the_refusal_names_the_limit(server: Server) -> None:
    r = httpx.post(server.base + "/v1/completions", content=LISTS,
                   headers={"Content-Type": "application/json"}, timeout=60)
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and "arrays and objects" in err["message"]
