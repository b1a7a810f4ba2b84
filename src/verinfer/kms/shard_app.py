"""HTTP face of a shard (FastAPI). Refusals: ``{"error": {"reason", "message", "shard_index"}}``
with the status :func:`http_status` gives the refusal (400/401/403/404/409/413/429/503, 500 for
the shard's own failures): the KMS and attestation errors are domain errors that know no HTTP,
and this table is the one place that decides what the caller is told.

Every request body is hostile until proven otherwise: nothing here lets FastAPI/pydantic parse
JSON. Before a byte of a body is read (``RequestGate``): a per-source token bucket on the two
POST endpoints (429), the declared size (413), and on ``/v1/decrypt`` a body larger than a
release request's bound must carry the admission headers (``kms.protocol.admission_headers``:
a signature by a registered verifier, checked in one recovery and one committee read) — so
strangers cannot make a shard read megabytes. While it is read (``verinfer.httpserve.BodyGuard``,
the operator's guard, with the shard's ``serve_limits``): the size bound, a whole-body deadline
(408) and a cap on the bytes of bodies in progress (503). Then, off the event loop, the value
counts (``jsonsafe.check_shape``: 16 MiB of ``[[],[],…]`` is refused at its count, not built) and
``verinfer.protocol.jsonsafe.loads_untrusted`` with a depth bound — the stdlib parser alone
segfaults on ~95k nested brackets once eth-account has raised the recursion limit, and a dead
shard is one fewer of the t a release needs.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import AsyncIterator, Callable
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
from verinfer.httpserve import BodyGuard, ServeLimits
from verinfer.kms.errors import (
    BadReleaseRequest,
    EpochError,
    EpochExistsError,
    EpochRetiredError,
    KmsUnavailableError,
    NotCommitteeMemberError,
    RateLimitedError,
    ReleaseRefused,
    RequesterSignatureError,
    RequestTooLargeError,
)
from verinfer.kms.identity import recover_eip191_signer
from verinfer.kms.protocol import (
    MAX_REQUEST_CONTAINERS,
    MAX_REQUEST_STRINGS,
    MAX_REQUEST_VALUES,
    max_decrypt_body_bytes,
    parse_admission_headers,
    requester_digest,
)
from verinfer.kms.ratelimit import TokenBucketLimiter
from verinfer.kms.shard import Decision, ShardService
from verinfer.protocol.hexutil import to_hex
from verinfer.protocol.jsonsafe import UntrustedJsonError, check_shape, loads_untrusted

log = logging.getLogger(__name__)

#: Largest release request a shard reads. A request is ~1 KB plus the quote; hardware quotes
#: with their certificate chain stay near 10-20 KB base64, 255 nonces add ~20 KB.
MAX_BODY_BYTES = 256 * 1024
#: A per-receipt decryption request carries the envelope blob (base64): at most a release
#: request plus the receipt plus the largest envelope DA holds (32 MiB) in base64
#: (``kms.protocol.max_decrypt_body_bytes``: 45,003,436 bytes). Only /v1/decrypt reads more
#: than MAX_BODY_BYTES, and only from an admitted requester (``RequestGate``).
MAX_DECRYPT_BODY_BYTES = max_decrypt_body_bytes(MAX_BODY_BYTES)
#: Wall time for a whole body, from its headers (BodyGuard): 45 MB at >= 750 KB/s. uvicorn
#: bounds an idle connection (keep-alive), not a client dripping a byte a second into a body.
BODY_DEADLINE_S = 60.0
#: Bytes of bodies in progress at once (BodyGuard, held until the answer): two of the largest
#: decryption requests and 16 MiB of others; past it 503 at once.
MAX_INFLIGHT_BODY_BYTES = 2 * MAX_DECRYPT_BODY_BYTES + 16 * 1024 * 1024
#: Open connections (uvicorn limit_concurrency; past it 503).
MAX_CONNECTIONS = 256
#: Per source address (the TCP peer) on POST /v1/release and /v1/decrypt, before anything is
#: read: a burst of 60, then 20 a second — far above what one enclave host asks (t requests
#: per job), and it caps what one client makes a shard verify and refuse.
SOURCE_RATE_CAPACITY = 60.0
SOURCE_RATE_REFILL_PER_S = 20.0
POST_PATHS = ("/v1/release", "/v1/decrypt")
#: scope["state"] key set by RequestGate when the admission headers verified
ADMITTED = "verinfer_admitted"
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


class RequestGate:
    """ASGI middleware: what is decided before a body is read. On the POST endpoints: the
    source's token bucket (429); a declared Content-Length over the path's bound (413, nothing
    read); on ``/v1/decrypt``, a body over ``small`` bytes (declared, or chunked) must carry the
    admission headers, verified by ``admit`` off the event loop (401/403/503; the handler then
    reads up to the path's bound, else up to ``small``). Counts its refusals in ``refused``."""

    def __init__(self, app: ASGIApp, *, index: int, limit: int,
                 path_limits: dict[str, int] | None = None,
                 sources: TokenBucketLimiter | None = None,
                 admit: Callable[[str, bytes, bytes], None] | None = None,
                 refused: Any = None) -> None:
        self.app, self.index, self.default_limit = app, index, limit
        self.path_limits = dict(path_limits or {})
        self.sources, self.admit, self.refused = sources, admit, refused

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            try:
                await self._gate(scope)
            except VerinferError as e:
                if self.refused is not None:
                    self.refused.labels(e.code or type(e).__name__).inc()
                await _refusal(self.index, e)(scope, receive, send)
                return
        await self.app(scope, receive, send)

    async def _gate(self, scope: Scope) -> None:
        path = scope.get("path", "")
        if self.sources is not None and path in POST_PATHS:
            client = scope.get("client")
            self.sources.take(f"source {client[0] if client else '?'}")
        limit = self.path_limits.get(path, self.default_limit)
        headers = {k.decode("latin-1").lower(): v.decode("latin-1")
                   for k, v in scope.get("headers", [])}
        declared: int | None = None
        if "content-length" in headers:
            try:
                declared = int(headers["content-length"])
            except ValueError:
                declared = -1
            if declared < 0:
                raise BadReleaseRequest("malformed Content-Length")
            if declared > limit:
                raise RequestTooLargeError(f"body of {declared} bytes exceeds the shard's "
                                           f"limit of {limit}")
        if path == DECRYPT_PATH and self.admit is not None \
                and limit > self.default_limit and (declared is None
                                                    or declared > self.default_limit):
            try:
                who = parse_admission_headers(headers)
            except BadReleaseRequest as e:
                if declared is None:
                    return  # chunked, unadmitted: read up to the small bound only
                raise RequestTooLargeError(f"body of {declared} bytes exceeds "
                                           f"{self.default_limit} without admission: "
                                           f"{e.message}") from e
            await run_in_threadpool(self.admit, who[0], who[1], who[2])
            scope.setdefault("state", {})[ADMITTED] = True


def _admit(service: ShardService) -> Callable[[str, bytes, bytes], None]:
    def admit(requester: str, rd: bytes, signature: bytes) -> None:
        """A large body's admission: the requester signed this report_data (the signature the
        body will carry) and is a registered verifier."""
        try:
            signer = recover_eip191_signer(requester_digest(rd), signature)
        except ValueError as e:
            raise RequesterSignatureError(f"admission signature: {e}") from e
        if signer != requester:
            raise RequesterSignatureError(f"admission signature is by {signer}, not "
                                          f"{requester}")
        if not service.cfg.committee.is_registered_verifier(requester):
            raise NotCommitteeMemberError(f"{requester} is not a registered verifier: a "
                                          "body this large is read only from one")
    return admit


def serve_limits(*, max_connections: int = MAX_CONNECTIONS,
                 body_deadline_s: float = BODY_DEADLINE_S) -> ServeLimits:
    """The shard's HTTP bounds: its app's BodyGuard and its uvicorn config read the same."""
    return ServeLimits(max_body_bytes=MAX_DECRYPT_BODY_BYTES, body_deadline_s=body_deadline_s,
                       max_inflight_body_bytes=MAX_INFLIGHT_BODY_BYTES,
                       max_connections=max_connections)


async def _read_body(request: Request, limit: int) -> bytes:
    buf = bytearray()
    async for chunk in request.stream():
        buf.extend(chunk)
        if len(buf) > limit:
            raise RequestTooLargeError(f"body exceeds the shard's limit of {limit} bytes")
    return bytes(buf)


def _parse(raw: bytes, limit: int, what: str) -> object:
    """Value counts first (cheap, on the raw bytes), then the bounded parser. A repeated key is
    refused: the last value would win here, the first in other readers of the same body."""
    check_shape(raw, strings=MAX_REQUEST_STRINGS, containers=MAX_REQUEST_CONTAINERS,
                values=MAX_REQUEST_VALUES, what=what)
    return loads_untrusted(raw, max_bytes=limit, depth=MAX_BODY_DEPTH, what=what,
                           unique_keys=True)


def create_app(service: ShardService, *, max_body_bytes: int = MAX_BODY_BYTES,
               max_decrypt_body_bytes: int = MAX_DECRYPT_BODY_BYTES,
               source_rate_capacity: float = SOURCE_RATE_CAPACITY,
               source_rate_refill_per_s: float = SOURCE_RATE_REFILL_PER_S,
               limits: ServeLimits | None = None) -> FastAPI:
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
    registry = CollectorRegistry()  # per app: several shards may share one test process
    gate_refusals = Counter("kms_gate_refusals", "Requests refused before their body was "
                            "read (source rate, size, admission)", ["reason"],
                            registry=registry)
    guard_reasons = {408: "request_timeout", 413: "request_too_large", 503: "server_busy"}

    def guard_error(status: int, message: str, code: str) -> bytes:
        return json.dumps({"error": {"reason": code, "message": message,
                                     "shard_index": service.index}}).encode()

    # inside RequestGate: the source bucket and the admission come before any body is held
    app.add_middleware(BodyGuard, limits=limits or serve_limits(), error_body=guard_error,
                       on_refuse=lambda status: gate_refusals.labels(
                           guard_reasons.get(status, str(status))).inc())
    app.add_middleware(RequestGate, index=service.index, limit=max_body_bytes,
                       path_limits={DECRYPT_PATH: max_decrypt_body_bytes},
                       sources=TokenBucketLimiter(source_rate_capacity,
                                                  source_rate_refill_per_s, time.monotonic),
                       admit=_admit(service), refused=gate_refusals)
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
        what = "decryption request" if per_receipt else "release request"
        body: object = None
        unparsable: VerinferError | None = None
        try:
            if not per_receipt:
                limit = max_body_bytes
            elif request.scope.get("state", {}).get(ADMITTED):
                limit = max_decrypt_body_bytes
            else:
                limit = min(max_body_bytes, max_decrypt_body_bytes)
            raw = await _read_body(request, limit)
            # off the event loop: /v1/nonce keeps answering while a large body is checked
            body = await run_in_threadpool(_parse, raw, limit, what)
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
