"""Request/response models of the OpenAI endpoints we serve.

Fields follow OpenAI's order; verinfer's extras sit in one marked block at the end. Unknown
fields are rejected so a client never believes an option took effect when it did not.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ChatMessageIn(_Strict):
    role: Literal["system", "developer", "user", "assistant"]
    content: str
    name: str | None = None


class StreamOptions(_Strict):
    include_usage: bool | None = None


class ChatCompletionRequest(_Strict):
    messages: Annotated[list[ChatMessageIn], Field(min_length=1)]
    model: str
    frequency_penalty: float | None = 0.0
    logit_bias: dict[str, float] | None = None
    logprobs: bool | None = False
    top_logprobs: int | None = None
    max_completion_tokens: int | None = None
    max_tokens: int | None = None
    n: int | None = 1
    presence_penalty: float | None = 0.0
    seed: int | None = None
    stop: str | list[str] | None = None
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    temperature: float | None = None
    top_p: float | None = None
    user: str | None = None
    # ---- verinfer extras --------------------------------------------------------------------
    top_k: int | None = None


class ChatMessageOut(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str
    refusal: None = None


class ChatChoice(BaseModel):
    index: int
    message: ChatMessageOut
    logprobs: None = None
    finish_reason: Literal["stop", "length"]


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class EngineEvidence(BaseModel):
    """What the engine can vouch for today; the signed receipt joins it (issue: receipts)."""

    model_id: str
    tokenizer_hash: str
    engine_fingerprint: str
    seed: int
    prompt_token_ids: list[int]
    output_token_ids: list[int]
    logit_digest: str


class ChatCompletionResponse(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage
    system_fingerprint: str
    # ---- verinfer extras --------------------------------------------------------------------
    verinfer: EngineEvidence


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
