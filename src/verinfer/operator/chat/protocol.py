"""Request/response models of POST /v1/chat/completions, in OpenAI's field order."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field

from verinfer.operator.protocol import (
    EngineEvidence,
    JsonFloat,
    JsonInt,
    StreamOptions,
    Strict,
    Usage,
)


class ChatMessageIn(Strict):
    role: Literal["system", "developer", "user", "assistant"]
    content: str
    name: str | None = None


class ChatCompletionRequest(Strict):
    """The body's schema. Omitted fields stay None here: their defaults, the limits and what the
    body means are the request rule's (verinfer.protocol.request_rule), applied to the body bytes
    by the serving code exactly as a verifier applies it."""

    messages: Annotated[list[ChatMessageIn], Field(min_length=1)]
    model: str
    frequency_penalty: JsonFloat | None = None
    logit_bias: dict[str, JsonFloat] | None = None
    logprobs: bool | None = None
    top_logprobs: JsonInt | None = None
    max_completion_tokens: JsonInt | None = None
    max_tokens: JsonInt | None = None
    n: JsonInt | None = None
    presence_penalty: JsonFloat | None = None
    seed: JsonInt | None = None
    stop: str | list[str] | None = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    temperature: JsonFloat | None = None
    top_p: JsonFloat | None = None
    user: str | None = None
    # ---- verinfer extras --------------------------------------------------------------------
    top_k: JsonInt | None = None
    prompt_commitments: str | None = None  # 0x + 32-byte Merkle root of documents referred to


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int] | None


class ChatTokenLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int] | None
    top_logprobs: list[TopLogprob]


class ChoiceLogprobs(BaseModel):
    content: list[ChatTokenLogprob] | None
    refusal: None = None


class ChatMessageOut(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str
    refusal: None = None


class ChatChoice(BaseModel):
    index: int
    message: ChatMessageOut
    logprobs: ChoiceLogprobs | None = None
    finish_reason: Literal["stop", "length"]
    # ---- verinfer extras --------------------------------------------------------------------
    verinfer: EngineEvidence


class ChatCompletionResponse(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage
    system_fingerprint: str
    # ---- verinfer extras --------------------------------------------------------------------
    verification: dict[str, Any] | None = None


class ChunkDelta(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None


class ChunkChoice(BaseModel):
    index: int
    delta: ChunkDelta
    logprobs: ChoiceLogprobs | None = None
    finish_reason: Literal["stop", "length"] | None = None
    # ---- verinfer extras --------------------------------------------------------------------
    verinfer: EngineEvidence | None = None  # on the choice's last chunk


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChunkChoice]
    usage: Usage | None = None
    system_fingerprint: str
    # ---- verinfer extras --------------------------------------------------------------------
    verification: dict[str, Any] | None = None  # on the final chunk only
