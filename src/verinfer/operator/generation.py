"""The serving core both endpoints share: the request body → engine jobs (by the protocol's
request rule, verinfer.protocol.request_rule — the same function the verifier judges with), run
whole or streamed, plus the stream text rule.

Choice ``k`` of a response is its own engine sequence with its own ExecRequest (own seed), so
every choice replays on its own.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from verinfer.engine.engine import Engine, GenerationResult, StepEvent
from verinfer.engine.served import prompt_tokenizer, served_model
from verinfer.errors import BadInputError, ContextLengthExceededError, ModelNotFoundError
from verinfer.operator.budget import Reservation
from verinfer.operator.protocol import (
    EngineEvidence,
    ModelCard,
    ModelList,
    StreamOptions,
    Usage,
)
from verinfer.protocol.exec_request import ExecRequest
from verinfer.protocol.hexutil import to_hex
from verinfer.protocol.request_rule import Endpoint, plan_request
from verinfer.protocol.sampling_params import SamplingParams
from verinfer.protocol.tools import ToolPolicy

T = TypeVar("T")

# Called by a stream after its last content/usage chunk with every choice's result; returns
# the verification object for the final chunk.
Finalizer = Callable[[list[GenerationResult]], Awaitable[dict[str, Any]]]


@dataclass(frozen=True)
class Job:
    index: int  # choice index in the response
    request: ExecRequest  # what the receipt commits to: the request rule's, never re-derived
    params: SamplingParams
    top_logprobs: int | None  # None: no logprobs
    tools: ToolPolicy | None = None  # chat: how the output reads as tool calls (the rule's)

    @property
    def prompt_ids(self) -> list[int]:
        return list(self.request.prompt_token_ids)


class ServingBase:
    def __init__(self, engine: Engine, model_name: str) -> None:
        self.engine, self.model_name = engine, model_name
        self.served = served_model(engine)
        self.prompts = prompt_tokenizer(engine)
        # No token covers more characters than the longest piece of the vocabulary (x 2: a
        # margin for normalizers that compose characters), so a text longer than this has at
        # least max_context tokens whatever its tokenization, and check_request refuses it.
        longest = max((len(t) for t in engine.tokenizer.spec.tokens), default=1)
        self.max_fitting_chars = (engine.max_context - 1) * 2 * max(longest, 1)

    def refuse_unfittable(self, texts: Sequence[str]) -> None:
        """Refuses, by length alone (O(n), before the tokenizer queue), a prompt text that
        cannot fit the server's window: tokenizing 256 Ki spaces takes ~5 s of the one
        tokenizer thread, only to be refused afterwards (tests/adversarial/
        test_operator_tokenizer_flood.py)."""
        for text in texts:
            if len(text) > self.max_fitting_chars:
                raise ContextLengthExceededError(
                    f"this server's context window is {self.engine.max_context} tokens; a "
                    f"prompt of {len(text)} characters cannot fit it (at most "
                    f"{self.max_fitting_chars} characters can)", param="prompt")

    def models(self, created: int) -> ModelList:
        return ModelList(data=[ModelCard(id=self.model_name, created=created)])

    def check_model(self, model: str) -> None:
        if model not in (self.model_name, to_hex(self.engine.model_id)):
            raise ModelNotFoundError(f"the model {model!r} does not exist; this server serves "
                                     f"{self.model_name!r}", param="model")

    def jobs(self, body: bytes, endpoint: Endpoint) -> list[Job]:
        """The body's jobs, exactly the ExecRequests of the request rule (the pydantic model
        has checked the body's shape; the rule decides what it means). Blocking (tokenizes)."""
        plan = plan_request(body, endpoint, self.served, self.prompts)
        out = []
        for k, req in enumerate(plan.requests):
            params = req.sampling_params()
            # the server's window (--max-context) may be smaller than the model's context: a
            # request that does not fit is refused here, never shortened
            self.engine.check_request(req.prompt_token_ids, params)
            out.append(Job(k, req, params, plan.policy.top_logprobs, plan.policy.tools))
        return out

    async def run(self, jobs: Sequence[Job], reservation: Reservation | None = None
                  ) -> list[GenerationResult]:
        """Runs ``jobs`` to their results. ``reservation``: the request's admitted share of the
        token budget (verinfer.operator.budget), given back job by job as each finishes."""
        futs = []
        try:
            for k, j in enumerate(jobs):
                fut = self.engine.submit(j.prompt_ids, j.params, top_logprobs=j.top_logprobs)
                if reservation is not None:
                    reservation.attach(k, fut)
                futs.append(fut)
            return list(await asyncio.gather(*(asyncio.wrap_future(f) for f in futs)))
        finally:
            # Cancelled (the client went away: ``unless_client_leaves``) or one job failed:
            # the engine drops the unfinished jobs; no receipt is issued for this response.
            for fut in futs:
                self.engine.cancel(fut)

    async def stream(self, jobs: Sequence[Job], reservation: Reservation | None = None
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
            if reservation is not None:
                reservation.attach(k, fut)
            futs.append(fut)
        pending = len(jobs)
        try:
            while pending:
                k, ev = await queue.get()
                if ev is not None:
                    yield jobs[k], ev
                else:
                    pending -= 1
                    yield jobs[k], futs[k].result()  # raises the engine's error, if any
        finally:
            # The client went away (the response task cancelled, this generator closed) or
            # the stream failed: the engine drops the unfinished jobs at its next step. No
            # receipt is issued for a stream that does not reach its final chunk, so nothing
            # is owed for them (docs/engine.md, "Cancellation").
            for fut in futs:
                self.engine.cancel(fut)

    async def final_fields(self, options: StreamOptions | None, jobs: Sequence[Job],
                           results: dict[int, GenerationResult], finalize: Finalizer | None
                           ) -> tuple[Usage | None, dict[str, Any] | None]:
        """A stream's final chunk: usage when asked for, and the verification object covering
        every byte sent before it."""
        ordered = [results[j.index] for j in jobs]
        usage = self.usage(jobs, ordered) if options is not None and options.include_usage \
            else None
        return usage, (await finalize(ordered) if finalize is not None else None)

    def evidence(self, job: Job, res: GenerationResult, output_text: str | None = None
                 ) -> EngineEvidence:
        return EngineEvidence(  # the response's JSON: identities and digests as 0x-hex
            model_id=to_hex(self.engine.model_id),
            tokenizer_hash=to_hex(self.engine.tokenizer.hash),
            engine_fingerprint=to_hex(self.engine.fingerprint.hash),
            seed=res.seed,
            prompt_token_ids=res.prompt_ids,
            output_token_ids=res.token_ids,
            logit_digest=to_hex(res.logit_digest),
            output_text=output_text,
        )

    @staticmethod
    def usage(jobs: Sequence[Job], results: Sequence[GenerationResult]) -> Usage:
        prompt = sum(len(p) for p in {tuple(j.prompt_ids): j.prompt_ids for j in jobs}.values())
        out = sum(len(r.token_ids) for r in results)
        return Usage(prompt_tokens=prompt, completion_tokens=out, total_tokens=prompt + out)


class ClientGoneError(BadInputError):
    """The client disconnected before its answer was ready: its jobs were cancelled and no
    receipt was issued (the answer, with its receipt, had nobody to go to)."""

    code = "client_disconnected"


async def unless_client_leaves(receive: Callable[[], Awaitable[Mapping[str, Any]]],
                               work: Awaitable[T]) -> T:
    """Awaits ``work`` (a non-streamed answer being generated) unless the client disconnects
    first (``receive``: the request's ASGI receive, its body already read, so the next message
    is ``http.disconnect``); then ``work`` is cancelled (``ServingBase.run`` cancels the engine
    jobs) and ClientGoneError raised. Streams need no watcher: Starlette cancels a streaming
    response's task when its client leaves (``ServingBase.stream``)."""
    task = asyncio.ensure_future(work)

    async def gone() -> None:
        try:
            while (await receive()).get("type") != "http.disconnect":
                pass
        except Exception:  # cannot tell: serve the answer as before rather than guess
            await asyncio.get_running_loop().create_future()

    watcher = asyncio.ensure_future(gone())
    try:
        await asyncio.wait((task, watcher), return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
        if not task.done():
            task.cancel()
    if task.done() and not task.cancelled():
        return task.result()  # the answer won the race: served (and receipted) as before
    with contextlib.suppress(asyncio.CancelledError):
        await task
    raise ClientGoneError("the client disconnected before the answer was ready")


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
