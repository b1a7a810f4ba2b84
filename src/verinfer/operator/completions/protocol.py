"""Request/response models of POST /v1/completions, in OpenAI's field order."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel

from verinfer.operator.protocol import (
    EngineEvidence,
    JsonFloat,
    JsonInt,
    StreamOptions,
    TransportOnly,
    Usage,
)


class CompletionRequest(TransportOnly):
    """The body's schema. Omitted fields stay None here: their defaults, the limits and what the
    body means are the request rule's (verinfer.protocol.request_rule), applied to the body bytes
    by the serving code exactly as a verifier applies it."""

    model: str
    prompt: str | list[str] | list[JsonInt] | list[list[JsonInt]]
    best_of: JsonInt | None = None
    echo: bool | None = None
    frequency_penalty: JsonFloat | None = None
    logit_bias: dict[str, JsonFloat] | None = None
    logprobs: JsonInt | None = None
    max_tokens: JsonInt | None = None
    n: JsonInt | None = None
    presence_penalty: JsonFloat | None = None
    seed: JsonInt | None = None
    stop: str | list[str] | None = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    suffix: str | None = None
    temperature: JsonFloat | None = None
    top_p: JsonFloat | None = None
    # ---- verinfer extras --------------------------------------------------------------------
    top_k: JsonInt | None = None
    prompt_commitments: str | None = None  # 0x + 32-byte Merkle root of documents referred to
    nonce: str | None = None  # folded into the derived seed: a fresh sample per nonce


class CompletionLogprobs(BaseModel):
    text_offset: list[int]
    token_logprobs: list[float]
    tokens: list[str]
    top_logprobs: list[dict[str, float]]


class CompletionChoice(BaseModel):
    finish_reason: Literal["stop", "length"] | None
    index: int
    logprobs: CompletionLogprobs | None = None
    text: str
    # ---- verinfer extras --------------------------------------------------------------------
    verinfer: EngineEvidence | None = None  # on the choice's last chunk when streaming


class Completion(BaseModel):
    id: str
    choices: list[CompletionChoice]
    created: int
    model: str
    object: Literal["text_completion"] = "text_completion"
    system_fingerprint: str
    usage: Usage | None = None
    # ---- verinfer extras --------------------------------------------------------------------
    verification: dict[str, Any] | None = None
