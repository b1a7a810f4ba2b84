"""HTTP face of a shard (FastAPI). Refusals: ``{"error": {"reason", "message", "shard_index"}}``
with the refusal's HTTP status (400/401/403/404/429/503)."""

from __future__ import annotations

import logging
import time
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Histogram,
    generate_latest,
)

from verinfer.errors import VerinferError
from verinfer.kms.shard import Decision, ShardService

log = logging.getLogger(__name__)


def create_app(service: ShardService) -> FastAPI:
    app = FastAPI(title=f"verinfer KMS shard {service.index}", docs_url=None, redoc_url=None)
    registry = CollectorRegistry()  # per app: several shards may share one test process
    nonces = Counter("kms_nonces_issued", "Nonces issued", registry=registry)
    decisions = Counter("kms_release_decisions", "Release decisions",
                        ["decision", "reason"], registry=registry)
    latency = Histogram("kms_release_seconds", "Release request handling time",
                        registry=registry, buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5))

    def refusal(e: VerinferError) -> JSONResponse:
        return JSONResponse({"error": {"reason": e.code, "message": e.message,
                                       "shard_index": service.index}},
                            status_code=e.status_code)

    @app.exception_handler(VerinferError)
    async def _verinfer(_: Request, e: VerinferError) -> JSONResponse:
        if e.status_code >= 500:
            log.error("shard %d: %s", service.index, e.message)
        return refusal(e)

    @app.get("/health")
    def health() -> dict[str, Any]:
        return {"status": "ok", "shard_index": service.index, "address": service.address}

    @app.get("/metrics")
    def metrics() -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    @app.post("/v1/nonce")
    def nonce() -> dict[str, Any]:
        grant = service.issue_nonce()
        nonces.inc()
        return {"shard_index": service.index, "nonce": "0x" + grant.nonce.hex(),
                "expires_at": grant.expires_at}

    @app.post("/v1/release")
    async def release(request: Request) -> JSONResponse:
        t0 = time.perf_counter()
        try:
            body = await request.json()
        except ValueError:
            body = None

        def count(d: Decision) -> None:
            decisions.labels("released" if d.released else "refused", d.reason).inc()

        try:
            rel = service.release(body, on_decision=count)
        finally:
            latency.observe(time.perf_counter() - t0)
        return JSONResponse(rel.to_json())

    return app
