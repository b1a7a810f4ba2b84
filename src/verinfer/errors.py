"""One exception tree for all of verinfer.

Client errors (4xx) are the caller's fault and carry an HTTP status plus an OpenAI error
``type``/``param``/``code``; server errors (5xx) are ours. The HTTP mapping lives in one place:
``verinfer.operator.errors``.
"""

from __future__ import annotations


class VerinferError(Exception):
    """Base of every error verinfer raises on purpose."""

    status_code: int = 500
    error_type: str = "server_error"
    code: str | None = None

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        if code is not None:
            self.code = code


# ---- client errors (4xx) -------------------------------------------------------------------
class ClientError(VerinferError):
    status_code = 400
    error_type = "invalid_request_error"


class InvalidRequestError(ClientError):
    """A parameter has a bad type, range or combination."""


class ContextLengthExceededError(ClientError):
    code = "context_length_exceeded"


class ModelNotFoundError(ClientError):
    status_code = 404
    code = "model_not_found"


class AuthenticationError(ClientError):
    """Missing or unknown API key."""

    status_code = 401
    code = "invalid_api_key"


class RateLimitError(ClientError):
    """The caller exceeded its request rate; ``retry_after`` seconds until a slot frees."""

    status_code = 429
    error_type = "requests"
    code = "rate_limit_exceeded"

    def __init__(self, message: str, *, retry_after: float) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class ModelLoadError(ClientError):
    """A weight file is missing, corrupt or of an unsupported architecture/format."""

    code = "model_load_error"


class TokenizerError(ClientError):
    code = "tokenizer_error"


# ---- server errors (5xx) -------------------------------------------------------------------
class ServerError(VerinferError):
    status_code = 500
    error_type = "server_error"


class KernelError(ServerError):
    """The compiled kernel library is missing or was called with inconsistent tensors."""


class EngineOverloadedError(ServerError):
    status_code = 503
    code = "engine_overloaded"
