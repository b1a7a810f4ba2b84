"""FastAPI application: thin routers over the serving logic."""

from __future__ import annotations

import time
from collections.abc import Callable

from fastapi import APIRouter, FastAPI, Request

from verinfer.engine.engine import Engine
from verinfer.operator.errors import error_response, install_error_handlers
from verinfer.operator.protocol import ChatCompletionRequest, ChatCompletionResponse, ModelList
from verinfer.operator.serving import ServingChat

MAX_BODY_BYTES = 4 * 1024 * 1024


def create_app(engine: Engine, model_name: str, *,
               clock: Callable[[], float] = time.time) -> FastAPI:
    app = FastAPI(title="verinfer operator", version="0.1.0")
    chat = ServingChat(engine, model_name, clock=clock)
    install_error_handlers(app)

    @app.middleware("http")
    async def _limit_body(request: Request, call_next):  # type: ignore[no-untyped-def]
        size = request.headers.get("content-length")
        if size is not None and size.isdigit() and int(size) > MAX_BODY_BYTES:
            return error_response(413, f"request body of {size} bytes exceeds the limit of "
                                  f"{MAX_BODY_BYTES}", "invalid_request_error")
        return await call_next(request)

    v1 = APIRouter(prefix="/v1")

    @v1.get("/models", response_model=ModelList)
    async def list_models() -> ModelList:
        return chat.models()

    @v1.post("/chat/completions", response_model=ChatCompletionResponse)
    async def chat_completions(req: ChatCompletionRequest) -> ChatCompletionResponse:
        return await chat.create(req)

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok", "model_id": engine.model_id,
                "system_fingerprint": engine.fingerprint.system_fingerprint}

    app.include_router(v1)
    return app
