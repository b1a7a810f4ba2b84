"""Request/response models of POST /v1/completions, in OpenAI's field order."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel

from verinfer.operator.protocol import EngineEvidence, StreamOptions, Strict, Usage


class CompletionRequest(Strict):
    model: str
    prompt: str | list[str] | list[int] | list[list[int]]
    best_of: int | None = None
    echo: bool | None = False
    frequency_penalty: float | None = 0.0
    logit_bias: dict[str, float] | None = None
    logprobs: int | None = None
    max_tokens: int | None = 16
    n: int | None = 1
    presence_penalty: float | None = 0.0
    seed: int | None = None
    stop: str | list[str] | None = None
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    suffix: str | None = None
    temperature: float | None = None
    top_p: float | None = None
    user: str | None = None
    # ---- verinfer extras --------------------------------------------------------------------
    top_k: int | None = None
    prompt_commitments: str | None = None  # 0x + 32-byte Merkle root of documents referred to


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
