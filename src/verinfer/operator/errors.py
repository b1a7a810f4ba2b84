"""The one place where exceptions become HTTP responses in OpenAI's error shape."""

from __future__ import annotations

import logging
import math
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from verinfer.chain.errors import ContractRevertError
from verinfer.da_client.errors import (
    BlobNotFoundError,
    BlobTooLargeError,
    CommitmentMismatchError,
    DAProtocolError,
    DAUnavailableError,
    OutboxConflictError,
)
from verinfer.errors import ClientError, RateLimitError, ServerError, VerinferError
from verinfer.operator.protocol import ErrorBody, ErrorResponse

log = logging.getLogger(__name__)

#: Domain error -> HTTP status where it is not the marker's generic 400 (caller's fault) /
#: 500 (ours); most specific first. The OpenAI API tree (ClientError/ServerError) carries its
#: own status.
HTTP_STATUS: tuple[tuple[type[VerinferError], int], ...] = (
    (BlobTooLargeError, 413),
    (BlobNotFoundError, 404),
    (OutboxConflictError, 409),
    (ContractRevertError, 409),
    (CommitmentMismatchError, 502),  # a backend returned bytes that are not the blob
    (DAProtocolError, 502),
    (DAUnavailableError, 503),
)


def http_status(e: VerinferError) -> int:
    """The HTTP status the operator's API answers ``e`` with."""
    if isinstance(e, ClientError | ServerError):
        return e.status_code
    for kind, status in HTTP_STATUS:
        if isinstance(e, kind):
            return status
    return 400 if e.caller_fault else 500


def _body(message: str, type_: str, param: str | None = None,
          code: str | None = None) -> dict[str, Any]:
    return ErrorResponse(error=ErrorBody(message=message, type=type_, param=param,
                                         code=code)).model_dump()


def error_payload(e: VerinferError) -> dict[str, Any]:
    return _body(e.message, e.error_type, e.param, e.code)


def error_response(status: int, message: str, type_: str, param: str | None = None,
                   code: str | None = None) -> JSONResponse:
    return JSONResponse(_body(message, type_, param, code), status_code=status)


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(VerinferError)
    async def _verinfer(_: Request, e: VerinferError) -> JSONResponse:
        status = http_status(e)
        if status >= 500:
            log.error("server error: %s", e.message)
        resp = JSONResponse(error_payload(e), status_code=status)
        retry_after = getattr(e, "retry_after", None)  # 429 rate limit, 503 not ready
        if isinstance(e, RateLimitError) or isinstance(retry_after, (int, float)):
            resp.headers["Retry-After"] = str(max(1, math.ceil(retry_after or 1)))
        return resp

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, e: RequestValidationError) -> JSONResponse:
        first = e.errors()[0] if e.errors() else {}
        loc = [str(x) for x in first.get("loc", ()) if x != "body"]
        if first.get("type") in ("json_invalid", "model_attributes_type") and not loc:
            return error_response(400, "request body is not a valid JSON object",
                                  "invalid_request_error")
        param = ".".join(loc) or None
        msg = f"{param or 'body'}: {first.get('msg', 'invalid value')}"
        return error_response(400, msg, "invalid_request_error", param)

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, e: StarletteHTTPException) -> JSONResponse:
        kind = "invalid_request_error" if e.status_code < 500 else "server_error"
        return error_response(e.status_code, str(e.detail), kind)

    @app.exception_handler(Exception)
    async def _unexpected(_: Request, e: Exception) -> JSONResponse:
        log.exception("unhandled error")
        return error_response(500, "internal server error", "server_error")
