"""HTTP face of a shard (FastAPI). Refusals: ``{"error": {"reason", "message", "shard_index"}}``
with the status :func:`http_status` gives the refusal (400/401/403/404/409/413/429/503, 500 for
the shard's own failures): the KMS and attestation errors are domain errors that know no HTTP,
and this table is the one place that decides what the caller is told.

Every request body is hostile until proven otherwise: nothing here lets FastAPI/pydantic parse
JSON. A body is refused by size before it is read (Content-Length) and while it is read
(chunked), then parsed by ``verinfer.protocol.jsonsafe.loads_untrusted`` with a depth bound —
the stdlib parser alone segfaults on ~95k nested brackets once eth-account has raised the
recursion limit, and a dead shard is one fewer of the t a release needs.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from starlette.concurrency import run_in_threadpool
from starlette.types import ASGIApp, Receive, Scope, Send

from verinfer.attestation.errors import AttestationError, QuoteMalformedError
from verinfer.errors import ClientError, ServerError, VerinferError
from verinfer.kms.errors import (
    BadReleaseRequest,
    EpochError,
    EpochExistsError,
    EpochRetiredError,
    KmsUnavailableError,
    RateLimitedError,
    ReleaseRefused,
    RequesterSignatureError,
    RequestTooLargeError,
)
from verinfer.kms.shard import Decision, ShardService
from verinfer.protocol.hexutil import to_hex
from verinfer.protocol.jsonsafe import UntrustedJsonError, loads_untrusted

log = logging.getLogger(__name__)

#: Largest release request a shard reads. A request is ~1 KB plus the quote; hardware quotes
#: with their certificate chain stay near 10-20 KB base64, 255 nonces add ~20 KB.
MAX_BODY_BYTES = 256 * 1024
#: A per-receipt decryption request carries the envelope blob (base64): request bodies are
#: bounded at 4 MiB (protocol/limits.py), padded envelopes with the response stay well below
#: 12 MiB, i.e. 16 MiB of base64. Only /v1/decrypt reads that much.
MAX_DECRYPT_BODY_BYTES = 16 * 1024 * 1024
#: A release request nests 3 deep ({"nonces": {...}}, {"quote": {...}}); a decryption
#: request 4 ({"target": {"receipt": {...}}}).
MAX_BODY_DEPTH = 8
DECRYPT_PATH = "/v1/decrypt"


#: Domain error -> HTTP status, most specific first. Anything not listed is the shard's own
#: failure (a broken registry, a sealed share that does not open, a bug): 500, never the
#: caller's fault.
HTTP_STATUS: tuple[tuple[type[VerinferError], int], ...] = (
    (RequestTooLargeError, 413),
    (BadReleaseRequest, 400),
    (RequesterSignatureError, 401),
    (RateLimitedError, 429),
    (ReleaseRefused, 403),
    (EpochExistsError, 409),
    (EpochRetiredError, 403),
    (EpochError, 404),
    (QuoteMalformedError, 400),
    (AttestationError, 403),
    (KmsUnavailableError, 503),
)


def http_status(e: VerinferError) -> int:
    """The HTTP status a shard answers ``e`` with."""
    for kind, status in HTTP_STATUS:
        if isinstance(e, kind):
            return status
    if isinstance(e, ClientError | ServerError):  # the API tree carries its own status
        return e.status_code
    return 400 if e.caller_fault else 500  # e.g. a malformed receipt in a decryption request


def _refusal(index: int, e: VerinferError) -> JSONResponse:
    return JSONResponse({"error": {"reason": e.code, "message": e.message,
                                   "shard_index": index}}, status_code=http_status(e))


class BodyLimit:
    """ASGI middleware: refuses any request whose declared Content-Length exceeds the bound
    before the app sees it (413, nothing read). Chunked bodies are bounded while read
    (``_read_body``)."""

    def __init__(self, app: ASGIApp, *, index: int, limit: int,
                 path_limits: dict[str, int] | None = None) -> None:
        self.app, self.index, self.default_limit = app, index, limit
        self.path_limits = dict(path_limits or {})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            limit = self.path_limits.get(scope.get("path", ""), self.default_limit)
            for name, value in scope.get("headers", []):
                if name == b"content-length":
                    try:
                        declared = int(value)
                    except ValueError:
                        declared = -1
                    if declared < 0 or declared > limit:
                        err = (RequestTooLargeError(f"body of {declared} bytes exceeds the "
                                                    f"shard's limit of {limit}")
                               if declared > limit else
                               BadReleaseRequest("malformed Content-Length"))
                        await _refusal(self.index, err)(scope, receive, send)
                        return
        await self.app(scope, receive, send)


async def _read_body(request: Request, limit: int) -> bytes:
    buf = bytearray()
    async for chunk in request.stream():
        buf += chunk
        if len(buf) > limit:
            raise RequestTooLargeError(f"body exceeds the shard's limit of {limit} bytes")
    return bytes(buf)


def create_app(service: ShardService, *, max_body_bytes: int = MAX_BODY_BYTES,
               max_decrypt_body_bytes: int = MAX_DECRYPT_BODY_BYTES) -> FastAPI:
    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        yield
        # at shutdown: a signed head covering everything this process logged
        head = await run_in_threadpool(service.cfg.release_log.checkpoint)
        log.info("shard %d: release log head %d %s signed at shutdown", service.index,
                 head.count, head.head)

    app = FastAPI(title=f"verinfer KMS shard {service.index}", docs_url=None, redoc_url=None,
                  openapi_url=None, lifespan=lifespan)
    app.state.service = service
    app.add_middleware(BodyLimit, index=service.index, limit=max_body_bytes,
                       path_limits={DECRYPT_PATH: max_decrypt_body_bytes})
    registry = CollectorRegistry()  # per app: several shards may share one test process
    nonces = Counter("kms_nonces_issued", "Nonces issued", registry=registry)
    decisions = Counter("kms_release_decisions", "Release decisions",
                        ["decision", "reason"], registry=registry)
    # Whether SoftwareEnclave quotes (no security boundary) can obtain shares: visible to
    # whoever monitors the shard, not only in its start-up log (attestation/tee_gate.py).
    insecure = bool(getattr(service.cfg.quote_verifier, "insecure_software_enclave", False))
    Gauge("kms_insecure_software_enclave", "1 when software-enclave quotes are accepted",
          registry=registry).set(1 if insecure else 0)
    latency = Histogram("kms_release_seconds", "Release request handling time",
                        registry=registry, buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5))

    @app.exception_handler(VerinferError)
    async def _verinfer(_: Request, e: VerinferError) -> JSONResponse:
        if http_status(e) >= 500:
            log.error("shard %d: %s", service.index, e.message)
        return _refusal(service.index, e)

    @app.get("/health")
    def health() -> dict[str, Any]:
        return {"status": "ok", "shard_index": service.index, "address": service.address,
                "insecure_software_enclave": insecure}

    @app.get("/metrics")
    def metrics() -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    @app.post("/v1/nonce")
    def nonce() -> dict[str, Any]:
        grant = service.issue_nonce()
        nonces.inc()
        return {"shard_index": service.index, "nonce": to_hex(grant.nonce),
                "expires_at": grant.expires_at}

    @app.get("/v1/log/head")
    def log_head() -> dict[str, Any]:
        # Signs a new head only when the log advanced since the last one, so polling costs
        # at most one signature per logged decision.
        return service.cfg.release_log.latest_head().to_json()

    async def handle(request: Request, *, per_receipt: bool) -> JSONResponse:
        t0 = time.perf_counter()
        limit = max_decrypt_body_bytes if per_receipt else max_body_bytes
        raw = await _read_body(request, limit)
        body: object = None
        unparsable: VerinferError | None = None
        try:
            body = loads_untrusted(raw, max_bytes=limit, depth=MAX_BODY_DEPTH,
                                   what="decryption request" if per_receipt
                                   else "release request")
        except UntrustedJsonError as e:
            unparsable = BadReleaseRequest(e.message)
        else:
            # one endpoint per kind, so each keeps its own size bound
            has_target = isinstance(body, dict) and body.get("target") is not None
            if has_target != per_receipt:
                unparsable = BadReleaseRequest(
                    "a per-receipt decryption (with a target) goes to /v1/decrypt, a share "
                    "release (without) to /v1/release", param="target")

        def count(d: Decision) -> None:
            decisions.labels("released" if d.released else "refused", d.reason).inc()

        try:
            # Off the event loop: the committee oracle makes blocking chain calls (up to 3 s)
            # and the log fsyncs; /health and /v1/nonce must keep answering meanwhile.
            rel = await run_in_threadpool(service.release, body, count, unparsable=unparsable)
        finally:
            latency.observe(time.perf_counter() - t0)
        return JSONResponse(rel.to_json())

    @app.post("/v1/release")
    async def release(request: Request) -> JSONResponse:
        return await handle(request, per_receipt=False)

    @app.post(DECRYPT_PATH)
    async def decrypt(request: Request) -> JSONResponse:
        return await handle(request, per_receipt=True)

    return app
