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
    TransportOnly,
    Usage,
)


class ChatMessageIn(Strict):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    # a string, or content parts: the request rule joins text parts and refuses the others by
    # type (request_rule.message_text), so their schema is the rule's, not repeated here
    content: str | list[dict[str, Any]] | None = None  # null: an assistant that only calls
    name: str | None = None
    # tool conversations: which keys each role takes, and their shapes, are the rule's
    # (request_rule._messages, verinfer.protocol.tools)
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None
    refusal: None = None  # an SDK echoing an answer back writes it as null

    def texts(self) -> list[str]:
        """Its text (for the pre-tokenizer bound; the rule reads the parts exactly)."""
        if self.content is None:
            return []
        if isinstance(self.content, str):
            return [self.content]
        return [p["text"] for p in self.content if isinstance(p.get("text"), str)]


class ChatCompletionRequest(TransportOnly):
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
    response_format: dict[str, Any] | None = None  # {"type": "text"} (the rule's check)
    # tool calling (verinfer.protocol.tools: shapes, defaults and refusals are the rule's)
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    functions: list[dict[str, Any]] | None = None  # legacy: refused by the rule, by name
    function_call: str | dict[str, Any] | None = None  # legacy: refused by the rule, by name
    reasoning_effort: str | None = None  # refused by the rule, by name
    modalities: list[str] | None = None  # ["text"]
    # ---- verinfer extras --------------------------------------------------------------------
    top_k: JsonInt | None = None
    prompt_commitments: str | None = None  # 0x + 32-byte Merkle root of documents referred to
    nonce: str | None = None  # folded into the derived seed: a fresh sample per nonce


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


class FunctionCall(BaseModel):
    name: str
    arguments: str  # a JSON text


class ToolCall(BaseModel):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class ToolCallDelta(ToolCall):
    index: int  # the call's position in the choice's tool_calls (the whole call in one delta)


class ChatMessageOut(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None  # None (left out): the answer is tool calls only
    refusal: None = None
    tool_calls: list[ToolCall] | None = None


class ChatChoice(BaseModel):
    index: int
    message: ChatMessageOut
    logprobs: ChoiceLogprobs | None = None
    finish_reason: Literal["stop", "length", "tool_calls"]
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
    tool_calls: list[ToolCallDelta] | None = None
    # ---- verinfer extras --------------------------------------------------------------------
    # the choice's verification entry, once, in the chunk after the evidence is published
    # (the OpenAI SDK's stream helper keeps a delta's keys in the final message; it drops the
    # final chunk's top-level ``verification``)
    verification: dict[str, Any] | None = None


class ChunkChoice(BaseModel):
    index: int
    delta: ChunkDelta
    logprobs: ChoiceLogprobs | None = None
    finish_reason: Literal["stop", "length", "tool_calls"] | None = None
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
