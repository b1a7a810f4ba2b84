"""X-Forwarded-For reset the per-client rate limit (issue 32.7).

The attack: without API keys the operator limits requests per client address. `verinfer
serve` ran ``uvicorn.run`` with its defaults, which believe ``X-Forwarded-For`` from
127.0.0.1 — so a client on the host, or behind any local forwarder, named a fresh address in
every request and never met the limit. Who gains: anyone who wants more than the limit.

Fix: proxy headers are believed only from ``--trusted-proxy`` (none by default;
``verinfer.httpserve.server_config``). A real `verinfer serve` on loopback, 6 requests per
minute (burst 1): 30 requests each naming a new address run into 429s.
"""

from __future__ import annotations

from pathlib import Path

import httpx

from support.inproc import serving
from support.servers import launched_server
from verinfer.engine.engine import Engine
from verinfer.httpserve import ServeLimits
from verinfer.operator.app import ServerConfig, create_app


def _statuses(base: str) -> list[int]:
    with httpx.Client(base_url=base, timeout=10) as c:
        return [c.get("/v1/models", headers={"X-Forwarded-For": f"203.0.113.{i}"}).status_code
                for i in range(30)]


def test_a_fresh_forwarded_address_per_request_does_not_reset_the_limit(tiny_path: Path
                                                                       ) -> None:
    with launched_server(tiny_path, "--unsafe-no-evidence", "--rate-limit", "6") as srv:
        statuses = _statuses(srv.base)
    # one token, refilled every 10 s: a slow machine may see a second 200, never 30
    assert statuses[0] == 200 and statuses.count(429) >= 25, statuses


def test_a_configured_proxy_is_believed(tiny_engine: Engine) -> None:
    """Behind a real proxy (``--trusted-proxy``) the forwarded address is the client's: each of
    the 30 is a different client, none limited."""
    limits = ServeLimits(max_body_bytes=4 * 1024 * 1024)
    app = create_app(tiny_engine, "tiny", ServerConfig(rate_limit_per_minute=6,
                                                       http_limits=limits))
    with serving(app, limits, trusted_proxies=["127.0.0.1"]) as (host, port):
        statuses = _statuses(f"http://{host}:{port}")
    assert statuses == [200] * 30, statuses
