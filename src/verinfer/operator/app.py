"""FastAPI application: thin routers over the serving logic, plus the cross-cutting concerns
(body limit, API keys, rate limits, metrics)."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field

from fastapi import APIRouter, Depends, FastAPI, Request, Response
from fastapi.responses import StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import BaseModel

from verinfer.engine.engine import Engine
from verinfer.errors import VerinferError
from verinfer.operator.chat.protocol import ChatCompletionRequest, ChatCompletionResponse
from verinfer.operator.chat.serving import ServingChat
from verinfer.operator.completions.protocol import Completion, CompletionRequest
from verinfer.operator.completions.serving import ServingCompletions
from verinfer.operator.errors import error_payload, error_response, install_error_handlers
from verinfer.operator.metrics import OperatorMetrics
from verinfer.operator.protocol import ModelList
from verinfer.operator.security import ApiKeys, RateLimiter

MAX_BODY_BYTES = 4 * 1024 * 1024


@dataclass
class ServerConfig:
    api_keys: Sequence[str] = ()
    rate_limit_per_minute: float | None = None  # None: no limit
    rate_limit_burst: int | None = None
    max_body_bytes: int = MAX_BODY_BYTES
    clock: Callable[[], float] = field(default=time.time)


def _sse(items: AsyncIterator[BaseModel]) -> AsyncIterator[bytes]:
    async def gen() -> AsyncIterator[bytes]:
        try:
            async for item in items:
                yield b"data: " + item.model_dump_json(exclude_none=True).encode() + b"\n\n"
        except VerinferError as e:  # the status line is gone: report in-band, OpenAI style
            yield b"data: " + json.dumps(error_payload(e)).encode() + b"\n\n"
        yield b"data: [DONE]\n\n"

    return gen()


def create_app(engine: Engine, model_name: str, config: ServerConfig | None = None) -> FastAPI:
    cfg = config or ServerConfig()
    app = FastAPI(title="verinfer operator", version="0.1.0")
    chat = ServingChat(engine, model_name, clock=cfg.clock)
    completions = ServingCompletions(engine, model_name, clock=cfg.clock)
    keys = ApiKeys(cfg.api_keys)
    limiter = (RateLimiter(cfg.rate_limit_per_minute, cfg.rate_limit_burst, clock=cfg.clock)
               if cfg.rate_limit_per_minute else None)
    metrics = OperatorMetrics()
    install_error_handlers(app)

    @app.middleware("http")
    async def _edge(request: Request, call_next):  # type: ignore[no-untyped-def]
        route = request.url.path
        size = request.headers.get("content-length")
        if size is not None and size.isdigit() and int(size) > cfg.max_body_bytes:
            metrics.requests.labels(route, "413").inc()
            return error_response(413, f"request body of {size} bytes exceeds the limit of "
                                  f"{cfg.max_body_bytes}", "invalid_request_error")
        t0 = time.perf_counter()
        metrics.in_flight.inc()
        try:
            response = await call_next(request)
        finally:
            metrics.in_flight.dec()
        metrics.requests.labels(route, str(response.status_code)).inc()
        metrics.latency.labels(route).observe(time.perf_counter() - t0)
        return response

    async def caller(request: Request) -> str:
        who = keys.check(request.headers.get("authorization"))
        if who == "open":
            who = "ip-" + (request.client.host if request.client else "unknown")
        if limiter is not None:
            limiter.acquire(who)
        return who

    v1 = APIRouter(prefix="/v1", dependencies=[Depends(caller)])

    @v1.get("/models", response_model=ModelList)
    async def list_models() -> ModelList:
        return chat.models(int(cfg.clock()))

    @v1.post("/chat/completions", response_model=ChatCompletionResponse,
             response_model_exclude_none=True)
    async def chat_completions(req: ChatCompletionRequest, request: Request) -> Response:
        jobs = chat.prepare(req, await request.body())
        if req.stream:
            return StreamingResponse(_sse(chat.create_stream(req, jobs)),
                                     media_type="text/event-stream")
        resp = await chat.create(req, jobs)
        metrics.tokens.labels("completion").inc(resp.usage.completion_tokens)
        return Response(resp.model_dump_json(exclude_none=True), media_type="application/json")

    @v1.post("/completions", response_model=Completion, response_model_exclude_none=True)
    async def text_completions(req: CompletionRequest, request: Request) -> Response:
        jobs = completions.prepare(req, await request.body())
        if req.stream:
            return StreamingResponse(_sse(completions.create_stream(req, jobs)),
                                     media_type="text/event-stream")
        resp = await completions.create(req, jobs)
        if resp.usage is not None:
            metrics.tokens.labels("completion").inc(resp.usage.completion_tokens)
        return Response(resp.model_dump_json(exclude_none=True), media_type="application/json")

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok", "model_id": engine.model_id,
                "system_fingerprint": engine.fingerprint.system_fingerprint}

    @app.get("/metrics")
    async def prometheus() -> Response:
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    app.include_router(v1)
    return app
