"""The serving core both endpoints share: OpenAI sampling options → engine jobs, run whole or
streamed, plus the stream text rule.

Choice ``i`` of a request with ``n`` choices is its own engine sequence with seed
``choice_seed(seed, i)``, so every choice replays on its own.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from verinfer.engine.engine import MAX_TOP_LOGPROBS, Engine, GenerationResult, StepEvent
from verinfer.engine.sampling import MAX_SEED, SamplingParams, choice_seed, request_seed
from verinfer.errors import InvalidRequestError, ModelNotFoundError
from verinfer.operator.protocol import (
    EngineEvidence,
    ModelCard,
    ModelList,
    StreamOptions,
    Usage,
)

MAX_CHOICES = 8

# Called by a stream after its last content/usage chunk with every choice's result; returns
# the verification object for the final chunk.
Finalizer = Callable[[list[GenerationResult]], Awaitable[dict[str, Any]]]


@dataclass(frozen=True)
class Job:
    index: int  # choice index in the response
    prompt_ids: list[int]
    params: SamplingParams
    top_logprobs: int | None  # None: no logprobs


@dataclass(frozen=True)
class SamplingOptions:
    """The OpenAI fields that shape decoding, after endpoint-specific defaults."""

    max_tokens: int | None  # None: up to the end of the context window
    temperature: float | None
    top_p: float | None
    top_k: int | None
    stop: str | list[str] | None
    seed: int | None
    n: int | None
    top_logprobs: int | None
    prompt_commitments: str | None


def reject_unsupported(fields: dict[str, bool]) -> None:
    for param, used in fields.items():
        if used:
            raise InvalidRequestError(f"{param} is not supported by this server", param=param)


class ServingBase:
    def __init__(self, engine: Engine, model_name: str) -> None:
        self.engine, self.model_name = engine, model_name

    def models(self, created: int) -> ModelList:
        return ModelList(data=[ModelCard(id=self.model_name, created=created)])

    def check_model(self, model: str) -> None:
        if model not in (self.model_name, self.engine.model_id):
            raise ModelNotFoundError(f"the model {model!r} does not exist; this server serves "
                                     f"{self.model_name!r}", param="model")

    def jobs(self, prompts: Sequence[list[int]], opt: SamplingOptions) -> list[Job]:
        n = 1 if opt.n is None else opt.n
        if not 1 <= n <= MAX_CHOICES:
            raise InvalidRequestError(f"n must be in [1, {MAX_CHOICES}], got {n}", param="n")
        if opt.top_logprobs is not None and not 0 <= opt.top_logprobs <= MAX_TOP_LOGPROBS:
            raise InvalidRequestError(f"top_logprobs must be in [0, {MAX_TOP_LOGPROBS}], got "
                                      f"{opt.top_logprobs}", param="top_logprobs")
        if opt.prompt_commitments is not None:
            _check_root(opt.prompt_commitments)
        if opt.seed is not None and not 0 <= opt.seed <= MAX_SEED:
            raise InvalidRequestError(f"seed must be in [0, 2^64), got {opt.seed}", param="seed")
        stop = (opt.stop,) if isinstance(opt.stop, str) else tuple(opt.stop or ())
        base = SamplingParams(
            max_tokens=opt.max_tokens if opt.max_tokens is not None else 1,
            temperature=1.0 if opt.temperature is None else opt.temperature,
            top_k=opt.top_k or 0,
            top_p=1.0 if opt.top_p is None else opt.top_p,
            stop=stop,
        ).validate()
        out: list[Job] = []
        for p, prompt in enumerate(prompts):
            params = base
            if opt.max_tokens is None:  # no explicit limit: up to the end of the context
                params = replace(base, max_tokens=max(1, self.engine.max_context - len(prompt)))
            # No seed given: derive it from what decides the output (never from transport
            # details such as `stream`), so the same request streams the same text.
            seed = (opt.seed if opt.seed is not None
                    else request_seed(self.engine.model_id, prompt, params))
            for i in range(n):
                job = Job(p * n + i, prompt, replace(params, seed=choice_seed(seed, i)),
                          opt.top_logprobs)
                self.engine.check_request(job.prompt_ids, job.params)
                out.append(job)
        return out

    async def run(self, jobs: Sequence[Job]) -> list[GenerationResult]:
        futs = [asyncio.wrap_future(self.engine.submit(j.prompt_ids, j.params,
                                                       top_logprobs=j.top_logprobs))
                for j in jobs]
        return list(await asyncio.gather(*futs))

    async def stream(self, jobs: Sequence[Job]
                     ) -> AsyncIterator[tuple[Job, StepEvent | GenerationResult]]:
        """Yields (job, step event) as tokens arrive, then (job, result) when a job is done."""
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[tuple[int, StepEvent | None]] = asyncio.Queue()
        futs = []
        for k, j in enumerate(jobs):
            def on_step(ev: StepEvent, k: int = k) -> None:
                loop.call_soon_threadsafe(queue.put_nowait, (k, ev))

            def on_done(_f: object, k: int = k) -> None:
                loop.call_soon_threadsafe(queue.put_nowait, (k, None))

            fut = self.engine.submit(j.prompt_ids, j.params, top_logprobs=j.top_logprobs,
                                     on_step=on_step)
            fut.add_done_callback(on_done)
            futs.append(fut)
        pending = len(jobs)
        while pending:
            k, ev = await queue.get()
            if ev is not None:
                yield jobs[k], ev
            else:
                pending -= 1
                yield jobs[k], futs[k].result()  # raises the engine's error, if any

    async def final_fields(self, options: StreamOptions | None, jobs: Sequence[Job],
                           results: dict[int, GenerationResult], finalize: Finalizer | None
                           ) -> tuple[Usage | None, dict[str, Any] | None]:
        """A stream's final chunk: usage when asked for, and the verification object covering
        every byte sent before it."""
        ordered = [results[j.index] for j in jobs]
        usage = self.usage(jobs, ordered) if options is not None and options.include_usage \
            else None
        return usage, (await finalize(ordered) if finalize is not None else None)

    def evidence(self, job: Job, res: GenerationResult) -> EngineEvidence:
        return EngineEvidence(
            model_id=self.engine.model_id,
            tokenizer_hash=self.engine.tokenizer.hash,
            engine_fingerprint=self.engine.fingerprint.hash,
            seed=res.seed,
            prompt_token_ids=res.prompt_ids,
            output_token_ids=res.token_ids,
            logit_digest=res.logit_digest,
        )

    @staticmethod
    def usage(jobs: Sequence[Job], results: Sequence[GenerationResult]) -> Usage:
        prompt = sum(len(p) for p in {tuple(j.prompt_ids): j.prompt_ids for j in jobs}.values())
        out = sum(len(r.token_ids) for r in results)
        return Usage(prompt_tokens=prompt, completion_tokens=out, total_tokens=prompt + out)


def _check_root(value: str) -> None:
    body = value[2:] if value.startswith("0x") else ""
    if len(body) != 64 or any(c not in "0123456789abcdefABCDEF" for c in body):
        raise InvalidRequestError(
            f"prompt_commitments must be 0x followed by 64 hex digits, got {value!r}",
            param="prompt_commitments")


class TextDeltas:
    """Turns one choice's growing output text into stream deltas that never need retracting.

    Held back until the text settles: a trailing U+FFFD (a UTF-8 sequence split across tokens)
    and any suffix that could be the start of a stop string. The deltas of a finished choice
    concatenate to exactly the non-streamed ``text``.
    """

    def __init__(self, stops: Sequence[str]) -> None:
        self.stops, self.sent = tuple(stops), 0

    def delta(self, text: str, finished: bool) -> str:
        end = len(text)
        if not finished:
            while end > self.sent and text[end - 1] == "\ufffd":
                end -= 1
            for stop in self.stops:
                for k in range(min(len(stop) - 1, end - self.sent), 0, -1):
                    if text[end - k:end] == stop[:k]:
                        end -= k
                        break
        if end <= self.sent:
            return ""
        out, self.sent = text[self.sent:end], end
        return out
