"""Serving logic for the chat endpoint: OpenAI request → engine call → OpenAI response."""

from __future__ import annotations

import asyncio
import hashlib
import uuid
from collections.abc import Callable

from verinfer.engine.chat import ChatMessage, render_chat
from verinfer.engine.engine import Engine
from verinfer.engine.sampling import SamplingParams, derive_seed
from verinfer.errors import InvalidRequestError, ModelNotFoundError
from verinfer.operator.protocol import (
    ChatChoice,
    ChatCompletionRequest,
    ChatCompletionResponse,
    ChatMessageOut,
    EngineEvidence,
    ModelCard,
    ModelList,
    Usage,
)

DEFAULT_MAX_TOKENS = 256


class ServingChat:
    def __init__(self, engine: Engine, model_name: str, *,
                 clock: Callable[[], float], new_id: Callable[[], str] | None = None) -> None:
        self.engine, self.model_name, self.clock = engine, model_name, clock
        self.new_id = new_id or (lambda: "chatcmpl-" + uuid.uuid4().hex)

    def models(self) -> ModelList:
        return ModelList(data=[ModelCard(id=self.model_name, created=int(self.clock()))])

    def check_model(self, model: str) -> None:
        if model not in (self.model_name, self.engine.model_id):
            raise ModelNotFoundError(f"the model {model!r} does not exist; this server serves "
                                     f"{self.model_name!r}", param="model")

    def sampling_params(self, req: ChatCompletionRequest, req_bytes: bytes) -> SamplingParams:
        unsupported = {
            "stream": bool(req.stream), "n": req.n not in (None, 1),
            "logprobs": bool(req.logprobs), "logit_bias": bool(req.logit_bias),
            "frequency_penalty": bool(req.frequency_penalty),
            "presence_penalty": bool(req.presence_penalty),
        }
        for param, bad in unsupported.items():
            if bad:
                raise InvalidRequestError(f"{param} is not supported by this server yet",
                                          param=param)
        stop = (req.stop,) if isinstance(req.stop, str) else tuple(req.stop or ())
        max_tokens = req.max_completion_tokens or req.max_tokens
        if max_tokens is None:
            max_tokens = DEFAULT_MAX_TOKENS
        seed = req.seed if req.seed is not None else derive_seed(hashlib.sha256(req_bytes).digest())
        if seed < 0:
            raise InvalidRequestError(f"seed must be >= 0, got {seed}", param="seed")
        return SamplingParams(
            max_tokens=max_tokens,
            temperature=1.0 if req.temperature is None else req.temperature,
            top_k=req.top_k or 0,
            top_p=1.0 if req.top_p is None else req.top_p,
            stop=stop,
            seed=seed,
        ).validate()

    async def create(self, req: ChatCompletionRequest) -> ChatCompletionResponse:
        self.check_model(req.model)
        req_bytes = req.model_dump_json(exclude_none=True).encode()
        params = self.sampling_params(req, req_bytes)
        msgs = [ChatMessage(m.role, m.content) for m in req.messages]
        prompt = render_chat(self.engine.tokenizer, msgs)
        if len(prompt) + params.max_tokens > self.engine.max_context and \
                req.max_tokens is None and req.max_completion_tokens is None:
            # No explicit limit: generate up to the end of the context window.
            room = self.engine.max_context - len(prompt)
            if room > 0:
                params = SamplingParams(**{**params.__dict__, "max_tokens": room})
        result = await asyncio.wrap_future(self.engine.submit(prompt, params))
        n_out = len(result.token_ids)
        return ChatCompletionResponse(
            id=self.new_id(),
            created=int(self.clock()),
            model=self.model_name,
            choices=[ChatChoice(index=0, message=ChatMessageOut(content=result.text),
                                finish_reason=result.finish_reason)],
            usage=Usage(prompt_tokens=len(prompt), completion_tokens=n_out,
                        total_tokens=len(prompt) + n_out),
            system_fingerprint=self.engine.fingerprint.system_fingerprint,
            verinfer=EngineEvidence(
                model_id=self.engine.model_id,
                tokenizer_hash=self.engine.tokenizer.hash,
                engine_fingerprint=self.engine.fingerprint.hash,
                seed=result.seed,
                prompt_token_ids=result.prompt_ids,
                output_token_ids=result.token_ids,
                logit_digest=result.logit_digest,
            ),
        )
