"""One exception tree for all of verinfer.

Every error says *whose fault* it is, and nothing about how an edge answers it:
``caller_fault`` is True for :class:`BadInputError` (the input handed in is wrong — a malformed
pointer, a bad signature, an unknown model: the caller can fix it) and False otherwise (this
side failed — a node down, a backend lying, a tampered local file, a bug). The edges read the
marker: a CLI exits 2 vs 1 (:mod:`verinfer.cli_errors`), an HTTP app answers 4xx vs 5xx.

Domain errors (engine, DA, receipts, chain, KMS, attestation, verifier, devnet, explorer, the
vLLM backend) carry only that marker and a machine-readable ``code``; the HTTP status is chosen at
the edge — the operator API (``verinfer.operator.errors``), the KMS shard app
(``verinfer.kms.shard_app``), the explorer (``verinfer.explorer.errors``). Only the OpenAI API
tree below (:class:`ClientError` 4xx / :class:`ServerError` 5xx, the errors the operator's
OpenAI-compatible API is specified to answer) carries its own status and OpenAI error
``type``/``param``/``code``.
"""

from __future__ import annotations

from typing import ClassVar


class VerinferError(Exception):
    """Base of every error verinfer raises on purpose. Not the caller's fault unless a
    subclass says so (:class:`BadInputError`)."""

    caller_fault: ClassVar[bool] = False
    code: str | None = None

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param  # the offending field, where there is one
        if code is not None:
            self.code = code

    # No HTTP status here: each HTTP edge maps the marker (and its own table) to one. The OpenAI
    # error "type" the operator's API answers is read from the marker the same way; the OpenAI
    # API tree below sets both as class attributes.
    @property
    def error_type(self) -> str:
        return "invalid_request_error" if self.caller_fault else "server_error"


class BadInputError(VerinferError):
    """The caller's fault: what was handed in is malformed, inconsistent or refused. Catch this
    (not :class:`ClientError`) for "the input is wrong" whichever part raised it."""

    caller_fault = True


# ---- the OpenAI API tree: client errors (4xx) -------------------------------------------------
class ClientError(BadInputError):
    """A request the OpenAI-compatible API refuses, with its own HTTP status."""

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


# ---- server errors (5xx) -------------------------------------------------------------------
class ServerError(VerinferError):
    """A failure of ours the OpenAI-compatible API answers with its own 5xx status."""

    status_code = 500
    error_type = "server_error"


class EngineOverloadedError(ServerError):
    status_code = 503
    code = "engine_overloaded"


# ---- the engine's domain errors (no HTTP status: the edges map them from the marker) -------
class ModelLoadError(BadInputError):
    """A weight file is missing, corrupt or of an unsupported architecture/format."""

    code = "model_load_error"


class TokenizerError(BadInputError):
    """A tokenizer cannot be built from the model's metadata, or refuses an input."""

    code = "tokenizer_error"


class KernelError(VerinferError):
    """The compiled kernel library is missing or was called with inconsistent tensors."""
