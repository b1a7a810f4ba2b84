"""API keys could be guessed without limit (issue 32.8).

The attack: with API keys on, the key check ran before any rate limit and a wrong key cost
nothing: 300 wrong keys drew 300 answers of 401 and no 429, so keys could be guessed at line
rate. Who gains: whoever finds a key (its owner's quota, its receipts' status).

Fix (``verinfer.operator.security.AuthThrottle``): failed checks are charged to the client
address's own bucket (burst 10, 30 a minute by default); an address without a token gets 429
for every attempt before its key is looked at, so a right guess cannot show. The operator app
with the defaults ``verinfer serve`` uses, on loopback, its clock held still (so the bucket
does not refill while the test runs, however slow the machine).
"""

from __future__ import annotations

import httpx

from support.inproc import serving
from verinfer.engine.engine import Engine
from verinfer.httpserve import ServeLimits
from verinfer.operator.app import ServerConfig, create_app

KEY = "right-key-" + "k" * 24


class Clock:
    def __init__(self) -> None:
        self.t = 1_000_000.0

    def __call__(self) -> float:
        return self.t


def test_three_hundred_wrong_keys_meet_429(tiny_engine: Engine) -> None:
    clock = Clock()
    limits = ServeLimits(max_body_bytes=4 * 1024 * 1024)
    app = create_app(tiny_engine, "tiny", ServerConfig(api_keys=[KEY], clock=clock,
                                                       http_limits=limits))
    right = {"Authorization": f"Bearer {KEY}"}
    with serving(app, limits) as (host, port), \
            httpx.Client(base_url=f"http://{host}:{port}", timeout=10) as c:
        assert c.get("/v1/models", headers=right).status_code == 200
        statuses = [c.get("/v1/models", headers={"Authorization": f"Bearer guess-{i}"}
                          ).status_code for i in range(300)]
        assert statuses[:10] == [401] * 10, statuses[:12]
        assert statuses[10:] == [429] * 290, sorted(set(statuses[10:]))
        # while the address is throttled even the right key is refused: a guess cannot show
        r = c.get("/v1/models", headers=right)
        assert r.status_code == 429 and int(r.headers["Retry-After"]) >= 1
        assert r.json()["error"]["code"] == "rate_limit_exceeded"
        assert c.get("/metrics", headers={"Authorization": "Bearer guess"}).status_code == 429
        clock.t += 60  # the bucket refills: the key holder is served again
        assert c.get("/v1/models", headers=right).status_code == 200
        # no key at all guesses nothing: a plain 401, not charged
        assert all(c.get("/v1/models").status_code == 401 for _ in range(50))
        # a key holder's own requests never drain it: only failures are charged
        assert all(c.get("/v1/models", headers=right).status_code == 200 for _ in range(50))
