"""Models shared by the OpenAI endpoints we serve (per-endpoint models live beside their serving
logic in ``chat/`` and ``completions/``).

Fields follow OpenAI's order; verinfer's extras sit in one marked block at the end of a model.
Requests reject unknown fields so a client never believes an option took effect when it did not.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict


class Strict(BaseModel):
    """Requests: unknown fields and loose coercions ("yes" as a bool, 1.5 as an int) are
    errors, not guesses."""

    model_config = ConfigDict(extra="forbid", strict=True)


class StreamOptions(Strict):
    include_usage: bool | None = None


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
