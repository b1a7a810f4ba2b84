"""FastAPI application: thin routers over the serving logic, plus the cross-cutting concerns
(body limit, API keys, rate limits, metrics)."""

from __future__ import annotations

import asyncio
import json
import logging
import sys
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from fastapi import APIRouter, Depends, FastAPI, Request, Response
from fastapi.responses import StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import BaseModel
from starlette.background import BackgroundTask

from verinfer.engine.engine import Engine, GenerationResult
from verinfer.errors import (
    AuthenticationError,
    EngineOverloadedError,
    InvalidRequestError,
    ModelNotFoundError,
    VerinferError,
)
from verinfer.httpserve import REFUSED, BodyGuard, ServeLimits
from verinfer.operator.budget import Reservation, TokenBudget
from verinfer.operator.chat.protocol import ChatCompletionRequest, ChatCompletionResponse
from verinfer.operator.chat.serving import ServingChat
from verinfer.operator.committer import StreamBatchIndex
from verinfer.operator.completions.protocol import Completion, CompletionRequest
from verinfer.operator.completions.serving import ServingCompletions
from verinfer.operator.errors import error_payload, error_response, install_error_handlers
from verinfer.operator.evidence import EvidencePipeline, Execution, check_evidence_size
from verinfer.operator.generation import Finalizer, Job, unless_client_leaves
from verinfer.operator.metrics import OperatorMetrics
from verinfer.operator.protocol import ModelCard, ModelList
from verinfer.operator.readiness import Readiness
from verinfer.operator.receipts_api import receipt_status, stream_receipt_status
from verinfer.operator.security import ApiKeys, AuthThrottle, RateLimiter
from verinfer.protocol import limits
from verinfer.protocol.hexutil import to_hex
from verinfer.protocol.request_rule import check_body_shape

MAX_BODY_BYTES = limits.MAX_BODY_BYTES
#: The answer's id for clients (the OpenAI SDK's ``_request_id``): the receipt id of a whole
#: answer (choice 0's when n > 1), so the SDK's request id is the receipt's; a stream's headers
#: leave before its receipt exists, so there it is the completion id every chunk carries (the
#: receipt id is in the final chunk's ``verification``).
REQUEST_ID_HEADER = "x-request-id"
#: Threads that tokenize requests: the tokenizer is pure Python, so it must not run on the
#: event loop (one 3.9 MB body froze every request, /health included, for 17 s). One thread:
#: every extra CPU-bound thread is one more contender for the GIL the event loop needs.
TOKENIZE_WORKERS = 1
#: GIL switch interval while serving. CPython's 5 ms default lets a CPU-bound thread (the
#: tokenizer) hold the GIL 5 ms each time the event loop gives it up for I/O — a request that
#: does a dozen I/O waits then takes 60 ms+ (the convoy effect). 0.5 ms bounds that wait.
GIL_SWITCH_INTERVAL_S = 0.0005
#: Requests tokenizing or waiting for a tokenizer thread; more get 503 at once.
TOKENIZE_QUEUE = 64
log = logging.getLogger(__name__)


@dataclass
class ServerConfig:
    api_keys: Sequence[str] = ()
    rate_limit_per_minute: float | None = None  # None: no limit
    rate_limit_burst: int | None = None
    max_body_bytes: int = MAX_BODY_BYTES
    # the HTTP bounds (body deadline, bodies in progress; verinfer.httpserve); None: the
    # defaults with max_body_bytes. The connection cap and header deadline are the server's
    # (serve_cli: httpserve.server_config with the same limits).
    http_limits: ServeLimits | None = None
    # Token budget (prompt + max_tokens, times every job): per request and for every request
    # in progress; None: REQUEST_WINDOWS / TOTAL_WINDOWS windows of the largest --max-context
    # served (verinfer.operator.budget).
    max_request_tokens: int | None = None
    max_queued_tokens: int | None = None
    # Failed API-key checks per client address per minute (keys on): past it, 429 for every
    # attempt from that address, right keys included, until its bucket refills.
    auth_failures_per_minute: float = 30.0
    auth_failures_burst: int = 10
    clock: Callable[[], float] = field(default=time.time)
    evidence: EvidencePipeline | None = None  # None: no receipts (unsafe_no_evidence)
    # Blockers that stop signing (identity not approved, publication backlog); None: none.
    readiness: Readiness | None = None
    # Production-unsafe modes this server runs in (shown in /health and the metrics).
    unsafe: Sequence[str] = ()
    # The unpublished-claim responder's totals (operator/claims.py: ClaimResponder.counts),
    # exported in /metrics; None: no chain, no claims.
    claim_counts: Callable[[], Any] | None = None
    # Stream mode (serving replicas, docs/deploy.md §6): GET /v1/receipts answers from the
    # committer's batch records, whichever replica signed the receipt; None: the outbox.
    receipt_index: StreamBatchIndex | None = None


class _SentBytes:
    """The exact SSE bytes a stream has produced so far (what its envelope must hold)."""

    def __init__(self) -> None:
        self.buf = bytearray()


def _sse(items: AsyncIterator[BaseModel], sent: _SentBytes) -> AsyncIterator[bytes]:
    async def gen() -> AsyncIterator[bytes]:
        try:
            async for item in items:
                frame = b"data: " + item.model_dump_json(exclude_none=True).encode() + b"\n\n"
                sent.buf += frame
                yield frame
        except VerinferError as e:  # the status line is gone: report in-band, OpenAI style
            yield b"data: " + json.dumps(error_payload(e)).encode() + b"\n\n"
        except Exception:
            log.exception("stream failed")
            yield b"data: " + json.dumps({"error": {
                "message": "internal server error", "type": "server_error", "param": None,
                "code": None}}).encode() + b"\n\n"
        yield b"data: [DONE]\n\n"

    return gen()


# Request JSON is parsed by the stdlib decoder, whose nesting guard is the interpreter's
# recursion limit; py_ecc (imported by eth-account) raises that limit to 100000, at which a
# deeply nested body overflows the C stack and kills the process. Keep it at the default.
SAFE_RECURSION_LIMIT = 1000


def _cap_recursion() -> None:
    if sys.getrecursionlimit() > SAFE_RECURSION_LIMIT:
        sys.setrecursionlimit(SAFE_RECURSION_LIMIT)


class Edge:
    """Pure ASGI middleware (no task group, so errors keep their type), inside
    ``verinfer.httpserve.BodyGuard`` (which bounds a body's size and how long it may take to
    arrive): the body's shape bound (a POST body is read here, checked by the request rule's
    ``check_body_shape`` and handed on: FastAPI parses and validates it on the event loop,
    where 4 MiB of one-element lists froze every request for seconds, and a UTF-16 body for
    20-58 s), plus the request metrics."""

    def __init__(self, app: Any, metrics: OperatorMetrics) -> None:
        self.app, self.metrics = app, metrics

    @staticmethod
    def _template(scope: Any) -> str:
        """The matched route's template (``/v1/receipts/{receipt_id}``), never the raw path:
        a client-chosen path as a label leaks it to whoever reads /metrics and grows the
        registry without bound."""
        route = scope.get("route")
        path = getattr(route, "path", None)
        return path if isinstance(path, str) else "unmatched"

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        _cap_recursion()
        m = self.metrics
        status = 500
        buffered: list[Any] = []
        if scope.get("method") == "POST":
            body = bytearray()
            while True:
                message = await receive()
                buffered.append(message)
                if message["type"] != "http.request":
                    break  # the client left (or the guard refused): the app sees it so
                body += message.get("body", b"")
                if not message.get("more_body", False):
                    break
            if REFUSED in scope:
                return  # BodyGuard has answered (408/413/503) and counted it
            try:
                check_body_shape(bytes(body))
            except InvalidRequestError as e:
                m.count("unrouted", 400)
                await error_response(400, e.message, "invalid_request_error",
                                     code=e.code or "request_too_complex")(scope, receive, send)
                return
            if buffered and buffered[-1]["type"] == "http.request":
                buffered = [{"type": "http.request", "body": bytes(body), "more_body": False}]

        async def replay() -> Any:
            return buffered.pop(0) if buffered else await receive()

        async def sent(message: Any) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        t0 = time.perf_counter()
        m.in_flight.inc()
        try:
            await self.app(scope, replay, sent)
        finally:
            m.in_flight.dec()
            if REFUSED not in scope:
                route = self._template(scope)
                m.count(route, status)
                m.latency.labels(route).observe(time.perf_counter() - t0)


_ERRORS = {"400": "Bad request: invalid JSON, field types, ranges or combinations",
           "401": "Missing or unknown API key", "404": "Unknown model or receipt",
           "408": "Request body not received within the deadline",
           "413": "Request body over the size limit", "429": "Rate limit reached",
           "500": "Server error",
           "503": "Not signing receipts now (see /health), overloaded (token budget, "
                  "bodies in progress, connections) or a request over the per-request token "
                  "budget; retry after Retry-After seconds"}


def _openapi(app: FastAPI) -> dict[str, Any]:
    """FastAPI's schema with the errors we really answer: OpenAI's error shape under 400
    (FastAPI documents its own 422, which this server never sends) and 401/404/413/429/500."""
    if app.openapi_schema:
        return app.openapi_schema
    from fastapi.openapi.utils import get_openapi

    from verinfer.operator.protocol import ErrorResponse

    schema = get_openapi(title=app.title, version=app.version, routes=app.routes)
    ref = {"$ref": "#/components/schemas/ErrorResponse"}
    comps = schema.setdefault("components", {}).setdefault("schemas", {})
    err = ErrorResponse.model_json_schema(ref_template="#/components/schemas/{model}")
    comps.update(err.pop("$defs", {}))
    comps["ErrorResponse"] = err
    for name in ("HTTPValidationError", "ValidationError"):
        comps.pop(name, None)
    for path in schema.get("paths", {}).values():
        for op in path.values():
            responses = op.setdefault("responses", {})
            responses.pop("422", None)
            for code, text in _ERRORS.items():
                responses.setdefault(code, {"description": text,
                                            "content": {"application/json": {"schema": ref}}})
    app.openapi_schema = schema
    return schema


def http_limits(cfg: ServerConfig) -> ServeLimits:
    """The operator's HTTP bounds (the app's BodyGuard and the server's config read the same)."""
    return cfg.http_limits or ServeLimits(max_body_bytes=cfg.max_body_bytes)


def check_work(texts: Sequence[str], messages: int = 0) -> None:
    """Bounds the tokenizer's work before it starts (limits table: verinfer.protocol.limits):
    counting characters is O(n) in C, tokenizing them is ~4 us each in Python."""
    if messages > limits.MAX_MESSAGES:
        raise InvalidRequestError(f"{messages} messages exceed the limit of "
                                  f"{limits.MAX_MESSAGES}", param="messages")
    chars = sum(len(t) for t in texts)
    if chars > limits.MAX_PROMPT_CHARS:
        raise InvalidRequestError(f"the prompt text has {chars} characters; the limit is "
                                  f"{limits.MAX_PROMPT_CHARS}", param="messages" if messages
                                  else "prompt", code="prompt_too_long")


def _prompt_texts(prompt: Any) -> list[str]:
    if isinstance(prompt, str):
        return [prompt]
    if isinstance(prompt, list):
        return [p for p in prompt if isinstance(p, str)]
    return []


class ModelRoutes:
    """The served models by the name clients send (``model`` in a request). A request names one
    of them -- or its model id (``0x`` + sha256 of the weights) -- and is served, tokenized and
    receipted by that model's engine alone: its own model id, tokenizer, request rule facts and
    fingerprint. Anything else is the OpenAI 404 ``model_not_found``."""

    def __init__(self, engines: Mapping[str, Engine], clock: Callable[[], float]) -> None:
        if not engines:
            raise ValueError("no model to serve")
        self.engines = dict(engines)
        self.chat = {n: ServingChat(e, n, clock=clock) for n, e in self.engines.items()}
        self.completions = {n: ServingCompletions(e, n, clock=clock)
                            for n, e in self.engines.items()}
        # a request names a model by its id as text: 0x + the weight file's sha256
        self._by_id = {to_hex(e.model_id): n for n, e in self.engines.items()}

    def name(self, model: str) -> str:
        if model in self.engines:
            return model
        by_id = self._by_id.get(model)
        if by_id is not None:
            return by_id
        raise ModelNotFoundError(f"the model {model!r} does not exist; this server serves "
                                 + ", ".join(repr(n) for n in self.engines), param="model")

    def models(self, created: int) -> ModelList:
        return ModelList(data=[card for c in self.chat.values()
                               for card in c.models(created).data])

    def model(self, model: str, created: int) -> ModelCard:
        """GET /v1/models/{model}: the card of a served name or model id (404 otherwise)."""
        return self.chat[self.name(model)].models(created).data[0]


def create_app(engine: Engine | Mapping[str, Engine], model_name: str | None = None,
               config: ServerConfig | None = None) -> FastAPI:
    """``engine``: one engine served as ``model_name``, or several by name (the first one's
    identity is also the top level of /health)."""
    cfg = config or ServerConfig()
    app = FastAPI(title="verinfer operator", version="0.1.0")
    if isinstance(engine, Engine):
        if model_name is None:
            raise ValueError("name the served model")
        engines: Mapping[str, Engine] = {model_name: engine}
    else:
        engines = engine
    routes = ModelRoutes(engines, cfg.clock)
    first = next(iter(routes.engines.values()))
    keys = ApiKeys(cfg.api_keys)
    limiter = (RateLimiter(cfg.rate_limit_per_minute, cfg.rate_limit_burst, clock=cfg.clock)
               if cfg.rate_limit_per_minute else None)
    throttle = AuthThrottle(RateLimiter(cfg.auth_failures_per_minute, cfg.auth_failures_burst,
                                        clock=cfg.clock))
    budget = TokenBudget.for_window(max(e.max_context for e in routes.engines.values()),
                                    cfg.max_request_tokens, cfg.max_queued_tokens)
    app.state.token_budget = budget  # read by tests and benches
    metrics = OperatorMetrics()
    readiness = cfg.readiness
    metrics.unsafe.set(len(cfg.unsafe))
    if cfg.claim_counts is not None:
        metrics.watch_claims(cfg.claim_counts)
    install_error_handlers(app)
    _cap_recursion()
    sys.setswitchinterval(min(sys.getswitchinterval(), GIL_SWITCH_INTERVAL_S))
    tokenizers = ThreadPoolExecutor(max_workers=TOKENIZE_WORKERS, thread_name_prefix="tokenize")
    tokenize_slots = asyncio.Semaphore(TOKENIZE_QUEUE)

    def address(request: Request) -> str:
        return "ip-" + (request.client.host if request.client else "unknown")

    def authenticate(request: Request) -> str:
        """keys.check, with failed attempts charged to the client's address: past
        ``auth_failures_burst`` (refilling at ``auth_failures_per_minute``) every attempt from
        it is 429 before its key is looked at, so keys cannot be guessed at line rate (issue
        32.8: 300 wrong keys had drawn 300 401s). A request with no key at all is a plain 401
        and charged nothing (it guesses nothing)."""
        if not keys.enabled:
            return "open"
        authorization = request.headers.get("authorization")
        if not ApiKeys.presents_key(authorization):
            return keys.check(authorization)  # 401 "missing API key": not a guess, not charged
        ip = address(request)
        throttle.require(ip)
        try:
            return keys.check(authorization)
        except AuthenticationError:
            throttle.failed(ip)
            raise

    async def caller(request: Request) -> str:
        who = authenticate(request)
        # the key that pays for a request owns its receipts (GET /v1/receipts/{id})
        request.state.key_digest = keys.digest(request.headers.get("authorization"))
        if who == "open":
            who = address(request)
        if limiter is not None:
            limiter.acquire(who)
        return who

    def require_ready() -> None:
        if readiness is None:
            return
        ready = readiness.ready
        metrics.ready.set(1 if ready else 0)
        if not ready:
            metrics.refused_not_ready.inc()
            readiness.require()

    async def tokenize(prepare: Callable[[Any], list[Job]], req: Any) -> list[Job]:
        """Runs ``prepare`` (chat template + tokenizer) on a worker thread."""
        if tokenize_slots.locked():
            raise EngineOverloadedError("too many requests are being tokenized; retry shortly")
        async with tokenize_slots:
            return await asyncio.get_running_loop().run_in_executor(tokenizers, prepare, req)

    v1 = APIRouter(prefix="/v1", dependencies=[Depends(caller)])

    @v1.get("/models", response_model=ModelList)
    async def list_models() -> ModelList:
        return routes.models(int(cfg.clock()))

    @v1.get("/models/{model:path}", response_model=ModelCard)
    async def retrieve_model(model: str) -> ModelCard:
        return routes.model(model, int(cfg.clock()))

    evidence = cfg.evidence

    async def publish(jobs: list[Job], results: list[GenerationResult], commitments: str | None,
                      body: bytes, response_body: bytes, owner: bytes | None
                      ) -> dict[str, Any]:
        assert evidence is not None
        executions = [Execution(j.request, r) for j, r in zip(jobs, results, strict=True)]
        t0 = time.perf_counter()
        out = await asyncio.to_thread(evidence.publish, executions, body, response_body,
                                      owner=owner)
        metrics.evidence_latency.observe(time.perf_counter() - t0)
        return out

    async def respond(resp: ChatCompletionResponse | Completion, jobs: list[Job],
                      results: list[GenerationResult], commitments: str | None,
                      body: bytes, owner: bytes | None) -> Response:
        metrics.tokens.labels("completion").inc(sum(len(r.token_ids) for r in results))
        out = resp.model_dump_json(exclude_none=True).encode()
        request_id = resp.id  # no receipts (unsafe_no_evidence): the response's own id
        if evidence is not None:
            resp.verification = await publish(jobs, results, commitments, body, out, owner)
            out = resp.model_dump_json(exclude_none=True).encode()
            request_id = resp.verification["receipt_id"]  # choice 0's, as at the top level
        return Response(out, media_type="application/json",
                        headers={REQUEST_ID_HEADER: request_id})

    def admit(jobs: list[Job], body: bytes) -> Reservation:
        """The request's share of the token budget, or 503 before any job reaches the engine;
        a 400 first when its body alone would make more evidence than one response may."""
        if evidence is not None:
            check_evidence_size(len(jobs), len(body))
        return budget.reserve([len(j.prompt_ids) + j.params.max_tokens for j in jobs])

    def stream(make: Callable[[Finalizer | None], AsyncIterator[BaseModel]], jobs: list[Job],
               commitments: str | None, body: bytes, owner: bytes | None,
               held: Reservation, request_id: str) -> StreamingResponse:
        sent = _SentBytes()

        async def finalize(results: list[GenerationResult]) -> dict[str, Any]:
            metrics.tokens.labels("completion").inc(sum(len(r.token_ids) for r in results))
            return await publish(jobs, results, commitments, body, bytes(sent.buf), owner)

        # the jobs' shares come back as their futures finish; a stream that never started
        # (its client gone first) submitted none: the background task gives those back
        return StreamingResponse(_sse(make(finalize if evidence is not None else None), sent),
                                 media_type="text/event-stream",
                                 headers={REQUEST_ID_HEADER: request_id},
                                 background=BackgroundTask(held.release_rest))

    @v1.post("/chat/completions", response_model=ChatCompletionResponse,
             response_model_exclude_none=True)
    async def chat_completions(req: ChatCompletionRequest, request: Request) -> Response:
        require_ready()
        chat = routes.chat[routes.name(req.model)]
        check_work([t for m in req.messages for t in m.texts()], len(req.messages))
        body = await request.body()
        owner = request.state.key_digest
        jobs = await tokenize(lambda r: chat.prepare(r, body), req)
        held = admit(jobs, body)
        if req.stream:
            rid = chat.new_id()
            return stream(lambda fin: chat.create_stream(req, jobs, fin, held, rid), jobs,
                          req.prompt_commitments, body, owner, held, rid)
        try:
            resp, results = await unless_client_leaves(request.receive,
                                                       chat.create(req, jobs, held))
        finally:
            held.release_rest()
        return await respond(resp, jobs, results, req.prompt_commitments, body, owner)

    @v1.post("/completions", response_model=Completion, response_model_exclude_none=True)
    async def text_completions(req: CompletionRequest, request: Request) -> Response:
        require_ready()
        completions = routes.completions[routes.name(req.model)]
        check_work(_prompt_texts(req.prompt))
        completions.refuse_unfittable(_prompt_texts(req.prompt))
        body = await request.body()
        owner = request.state.key_digest
        jobs = await tokenize(lambda r: completions.prepare(r, body), req)
        held = admit(jobs, body)
        if req.stream:
            rid = completions.new_id()
            return stream(lambda fin: completions.create_stream(req, jobs, fin, held, rid),
                          jobs, req.prompt_commitments, body, owner, held, rid)
        try:
            resp, results = await unless_client_leaves(request.receive,
                                                       completions.create(req, jobs, held))
        finally:
            held.release_rest()
        return await respond(resp, jobs, results, req.prompt_commitments, body, owner)

    @v1.get("/receipts/{receipt_id}")
    async def get_receipt(receipt_id: str, request: Request) -> dict[str, Any]:
        if evidence is None:
            raise ModelNotFoundError("this server does not issue receipts", param="receipt_id")
        # With API keys, a receipt's status is the paying key's business only (its state
        # tells who is using the service and when); without keys the API is open anyway.
        owner = request.state.key_digest if keys.enabled else None
        if cfg.receipt_index is not None:
            return await asyncio.to_thread(stream_receipt_status, cfg.receipt_index,
                                           evidence.outbox, evidence.domain, receipt_id,
                                           owner=owner)
        return await asyncio.to_thread(receipt_status, evidence.outbox, evidence.domain,
                                       receipt_id, owner=owner)

    def readiness_state() -> tuple[bool, dict[str, str]]:
        if readiness is None:
            return True, {}
        ready, reasons = readiness.ready, readiness.reasons()
        metrics.ready.set(1 if ready else 0)
        return ready, reasons

    @app.get("/health")
    async def health() -> dict[str, Any]:
        """Liveness (always 200 while the process serves) plus why it would refuse to sign."""
        ready, reasons = readiness_state()
        fp = first.fingerprint
        return {"status": "ok", "ready": ready, "not_ready": reasons,
                "unsafe": list(cfg.unsafe), "model_id": to_hex(first.model_id),
                "system_fingerprint": fp.system_fingerprint,
                "engine_fingerprint": {"hash": to_hex(fp.hash), "approved": fp.approved(),
                                       "reported": fp.reported},
                "models": {n: {"model_id": to_hex(e.model_id),
                               "tokenizer_hash": to_hex(e.tokenizer.hash),
                               "system_fingerprint": e.fingerprint.system_fingerprint,
                               "engine_fingerprint_hash": to_hex(e.fingerprint.hash)}
                           for n, e in routes.engines.items()}}

    @app.get("/ready")
    async def ready_probe() -> Response:
        """Readiness for load balancers: 200 when signing, else 503 with the reasons."""
        ready, reasons = readiness_state()
        return Response(json.dumps({"ready": ready, "not_ready": reasons}),
                        status_code=200 if ready else 503, media_type="application/json")

    @app.get("/metrics")
    async def prometheus(request: Request) -> Response:
        # Protected like the API: with keys configured, only a key holder reads it.
        authenticate(request)
        readiness_state()
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    app.include_router(v1)
    app.openapi = lambda: _openapi(app)  # type: ignore[method-assign]
    app.add_middleware(Edge, metrics=metrics)
    # outermost: bounds every body before anything reads it (verinfer.httpserve)
    app.add_middleware(BodyGuard, limits=http_limits(cfg),
                       on_refuse=lambda status: metrics.count("unrouted", status))
    return app
