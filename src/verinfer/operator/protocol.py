"""Models shared by the OpenAI endpoints we serve (per-endpoint models live beside their serving
logic in ``chat/`` and ``completions/``).

Fields follow OpenAI's order; verinfer's extras sit in one marked block at the end of a model.
Requests reject unknown fields so a client never believes an option took effect when it did not.
The request models are the API's schema and first check only: what a body *means* (defaults,
limits, seeds, the ExecRequests to run) is decided by verinfer.protocol.request_rule, from the
body bytes, exactly as a verifier decides it.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict

from verinfer.protocol.limits import MAX_EXACT_FLOAT_INT


def _exact_int(value: object) -> object:
    # JSON has one number type: 8.0 is the integer 8 (the request rule reads it so too)
    if type(value) is float and value.is_integer() and abs(value) <= MAX_EXACT_FLOAT_INT:
        return int(value)
    return value


def _plain_float(value: object) -> object:
    # one double per JSON number, and no signed zero (-0.0 is the temperature 0)
    if type(value) is float:
        return value + 0.0
    return value


#: An integer field that also takes an exact float (``8.0``), as the request rule does.
JsonInt = Annotated[int, BeforeValidator(_exact_int)]
#: A number field; ``-0.0`` is read as ``0.0``, as the request rule does.
JsonFloat = Annotated[float, BeforeValidator(_plain_float)]


class Strict(BaseModel):
    """Requests: unknown fields and loose coercions ("yes" as a bool, 1.5 as an int) are
    errors, not guesses."""

    model_config = ConfigDict(extra="forbid", strict=True)


class StreamOptions(Strict):
    include_usage: bool | None = None


class TransportOnly(Strict):
    """Fields that never change the output (verinfer.protocol.request_rule.TRANSPORT_ONLY):
    accepted so SDKs and gateways that set them work; the request rule checks their types."""

    metadata: dict[str, str] | None = None
    prompt_cache_key: str | None = None
    safety_identifier: str | None = None
    service_tier: str | None = None
    store: bool | None = None
    user: str | None = None


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class EngineEvidence(BaseModel):
    """What the engine vouches for: enough to replay the request bit for bit."""

    model_id: str
    tokenizer_hash: str
    engine_fingerprint: str
    seed: int
    prompt_token_ids: list[int]
    output_token_ids: list[int]
    logit_digest: str
    # the output text the receipt's text hash covers, when the message does not show it whole:
    # a choice read as tool calls (content null or the text before the first call)
    output_text: str | None = None


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "verinfer"


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class ErrorBody(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    error: ErrorBody
