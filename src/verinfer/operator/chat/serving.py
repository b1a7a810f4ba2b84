"""Serving logic for POST /v1/chat/completions: OpenAI request → engine jobs → OpenAI response
(whole, or as server-sent-event chunks)."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Literal

from verinfer.engine.chat import ToolsUnsupportedError
from verinfer.engine.engine import Engine, GenerationResult, StepEvent
from verinfer.engine.logprobs import TokenLogprob
from verinfer.operator.budget import Reservation
from verinfer.operator.chat.protocol import (
    ChatChoice,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatCompletionResponse,
    ChatMessageOut,
    ChatTokenLogprob,
    ChoiceLogprobs,
    ChunkChoice,
    ChunkDelta,
    FunctionCall,
    ToolCall,
    ToolCallDelta,
    TopLogprob,
)
from verinfer.operator.generation import Finalizer, Job, ServingBase, TextDeltas
from verinfer.protocol.tools import CALL_OPEN, ChoiceOutput, read_output, tool_calls_json


def choice_output(job: Job, text: str) -> tuple[ChoiceOutput, list[ToolCall] | None]:
    """A choice's content and tool calls, read from its output text by the protocol's rule
    (verinfer.protocol.tools.read_output; ids from the choice's ExecRequest hash)."""
    out = read_output(job.tools, text)
    if not out.calls:
        return out, None
    calls = [ToolCall(id=c["id"], function=FunctionCall(**c["function"]))
             for c in tool_calls_json(out.calls, job.request.hash)]
    return out, calls


class ToolTextDeltas(TextDeltas):
    """Stream deltas of a choice that may call tools: nothing for a forced call (the answer is
    the call), and for ``auto`` the text before the first ``<tool_call>``, holding back a
    partial marker and trailing whitespace (both may turn out to belong to a call). The rest is
    settled by :meth:`rest` once the whole output is read."""

    def __init__(self, job: Job) -> None:
        super().__init__((*job.params.stop, CALL_OPEN))
        self.job = job

    def delta(self, text: str, finished: bool) -> str:
        if self.job.tools is None or self.job.tools.forced:
            return ""
        at = text.find(CALL_OPEN)
        visible = text if at < 0 else text[:at]
        sent = self.sent
        piece = super().delta(visible, False)  # holds back a partial marker, then
        kept = piece.rstrip()  # the whitespace before it
        self.sent = sent + len(kept)
        return kept

    def rest(self, out: ChoiceOutput, text: str) -> str:
        """What is left to send of the content once the output is read."""
        content = (out.content or "") if out.calls else text
        piece, self.sent = content[self.sent:], len(content)
        return piece


class ServingChat(ServingBase):
    def __init__(self, engine: Engine, model_name: str, *, clock: Callable[[], float],
                 new_id: Callable[[], str] | None = None) -> None:
        super().__init__(engine, model_name)
        self.clock = clock
        self.new_id = new_id or (lambda: "chatcmpl-" + uuid.uuid4().hex)

    def prepare(self, req: ChatCompletionRequest, body: bytes) -> list[Job]:
        """``req`` is ``body`` as the schema parsed it; the jobs come from ``body`` itself,
        through the request rule, exactly as a verifier will derive them."""
        self.check_model(req.model)
        try:
            return self.jobs(body, "chat")
        except ToolsUnsupportedError as e:
            raise ToolsUnsupportedError(e.detail, self.model_name) from None  # name it

    def _logprobs(self, lps: Sequence[TokenLogprob]) -> ChoiceLogprobs:
        tok = self.engine.tokenizer

        def entry(tid: int) -> tuple[str, list[int]]:
            b = tok.decode_bytes([tid], skip_special=False)
            return b.decode("utf-8", errors="replace"), list(b)

        content = []
        for lp in lps:
            text, raw = entry(lp.token_id)
            top = [TopLogprob(token=t, logprob=v, bytes=r)
                   for t, r, v in ((*entry(i), v) for i, v in lp.top)]
            content.append(ChatTokenLogprob(token=text, logprob=lp.logprob, bytes=raw,
                                            top_logprobs=top))
        return ChoiceLogprobs(content=content)

    async def create(self, req: ChatCompletionRequest, jobs: list[Job],
                     reservation: Reservation | None = None
                     ) -> tuple[ChatCompletionResponse, list[GenerationResult]]:
        results = await self.run(jobs, reservation)
        choices = []
        for j, r in zip(jobs, results, strict=True):
            out, calls = choice_output(j, r.text)
            choices.append(ChatChoice(
                index=j.index, message=ChatMessageOut(content=out.content, tool_calls=calls),
                logprobs=self._logprobs(r.logprobs) if r.logprobs is not None else None,
                finish_reason="tool_calls" if calls else r.finish_reason,
                verinfer=self.evidence(j, r, r.text if calls else None)))
        return ChatCompletionResponse(
            id=self.new_id(),
            created=int(self.clock()),
            model=self.model_name,
            choices=choices,
            usage=self.usage(jobs, results),
            system_fingerprint=self.engine.fingerprint.system_fingerprint,
        ), results

    async def create_stream(self, req: ChatCompletionRequest, jobs: list[Job],
                            finalize: Finalizer | None = None,
                            reservation: Reservation | None = None,
                            cid: str | None = None
                            ) -> AsyncIterator[ChatCompletionChunk]:
        """Chunks in OpenAI's order: a role chunk per choice, content deltas, each choice's
        finish chunk (with its engine evidence), then the usage chunk when asked for."""
        # cid: the caller's when it sent the id ahead (the x-request-id header)
        cid, created = cid or self.new_id(), int(self.clock())
        fp = self.engine.fingerprint.system_fingerprint

        def chunk(choices: list[ChunkChoice]) -> ChatCompletionChunk:
            return ChatCompletionChunk(id=cid, created=created, model=self.model_name,
                                       choices=choices, system_fingerprint=fp)

        for j in jobs:
            yield chunk([ChunkChoice(index=j.index, delta=ChunkDelta(role="assistant",
                                                                     content=""))])
        deltas = {j.index: ToolTextDeltas(j) if j.tools is not None else TextDeltas(j.params.stop)
                  for j in jobs}
        results: dict[int, GenerationResult] = {}
        async for job, item in self.stream(jobs, reservation):
            if isinstance(item, StepEvent):
                text = deltas[job.index].delta(item.text, item.finished is not None)
                lp = self._logprobs([item.logprob]) if item.logprob is not None else None
                if text or lp is not None:
                    yield chunk([ChunkChoice(index=job.index, delta=ChunkDelta(content=text),
                                             logprobs=lp)])
            else:
                results[job.index] = item
                finish: Literal["stop", "length", "tool_calls"] = item.finish_reason
                d = deltas[job.index]
                if isinstance(d, ToolTextDeltas):
                    out, calls = choice_output(job, item.text)
                    rest = d.rest(out, item.text)
                    if rest:
                        yield chunk([ChunkChoice(index=job.index,
                                                 delta=ChunkDelta(content=rest))])
                    if calls:
                        finish = "tool_calls"
                        yield chunk([ChunkChoice(index=job.index, delta=ChunkDelta(
                            tool_calls=[ToolCallDelta(index=i, **c.model_dump())
                                        for i, c in enumerate(calls)]))])
                yield chunk([ChunkChoice(
                    index=job.index, delta=ChunkDelta(), finish_reason=finish,
                    verinfer=self.evidence(job, item,
                                           item.text if finish == "tool_calls" else None))])
        final = chunk([])
        final.usage, final.verification = await self.final_fields(req.stream_options, jobs,
                                                                  results, finalize)
        if final.verification is not None:
            # after the bytes the envelope holds: each choice's entry as a delta, so the SDK's
            # chat.completions.stream(...).get_final_completion() reaches its receipt too
            entries = final.verification.get("choices") or [final.verification]
            yield chunk([ChunkChoice(index=j.index, delta=ChunkDelta(verification=e))
                         for j, e in zip(jobs, entries, strict=True)])
        if final.usage is not None or final.verification is not None:
            yield final
