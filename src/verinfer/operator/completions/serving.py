"""Serving logic for POST /v1/completions: raw prompt text or token ids, no chat template."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Callable, Sequence

from verinfer.engine.engine import Engine, GenerationResult, StepEvent
from verinfer.engine.logprobs import TokenLogprob
from verinfer.operator.budget import Reservation
from verinfer.operator.completions.protocol import (
    Completion,
    CompletionChoice,
    CompletionLogprobs,
    CompletionRequest,
)
from verinfer.operator.generation import Finalizer, Job, ServingBase, TextDeltas


class ServingCompletions(ServingBase):
    def __init__(self, engine: Engine, model_name: str, *, clock: Callable[[], float],
                 new_id: Callable[[], str] | None = None) -> None:
        super().__init__(engine, model_name)
        self.clock = clock
        self.new_id = new_id or (lambda: "cmpl-" + uuid.uuid4().hex)

    def prepare(self, req: CompletionRequest, body: bytes) -> list[Job]:
        """``req`` is ``body`` as the schema parsed it; the jobs come from ``body`` itself,
        through the request rule, exactly as a verifier will derive them."""
        self.check_model(req.model)
        return self.jobs(body, "completions")

    def _logprobs(self, lps: Sequence[TokenLogprob], offset: int) -> CompletionLogprobs:
        tok = self.engine.tokenizer

        def text(tid: int) -> str:
            return tok.decode_bytes([tid], skip_special=False).decode("utf-8", errors="replace")

        out = CompletionLogprobs(text_offset=[], token_logprobs=[], tokens=[], top_logprobs=[])
        for lp in lps:
            t = text(lp.token_id)
            out.text_offset.append(offset)
            out.tokens.append(t)
            out.token_logprobs.append(lp.logprob)
            out.top_logprobs.append({text(i): v for i, v in lp.top})
            offset += len(t)
        return out

    def _choice(self, job: Job, res: GenerationResult) -> CompletionChoice:
        return CompletionChoice(
            finish_reason=res.finish_reason, index=job.index, text=res.text,
            logprobs=self._logprobs(res.logprobs, 0) if res.logprobs is not None else None,
            verinfer=self.evidence(job, res))

    async def create(self, req: CompletionRequest, jobs: list[Job],
                     reservation: Reservation | None = None
                     ) -> tuple[Completion, list[GenerationResult]]:
        results = await self.run(jobs, reservation)
        return Completion(
            id=self.new_id(), created=int(self.clock()), model=self.model_name,
            choices=[self._choice(j, r) for j, r in zip(jobs, results, strict=True)],
            system_fingerprint=self.engine.fingerprint.system_fingerprint,
            usage=self.usage(jobs, results)), results

    async def create_stream(self, req: CompletionRequest, jobs: list[Job],
                            finalize: Finalizer | None = None,
                            reservation: Reservation | None = None,
                            cid: str | None = None) -> AsyncIterator[Completion]:
        # cid: the caller's when it sent the id ahead (the x-request-id header)
        cid, created = cid or self.new_id(), int(self.clock())
        fp = self.engine.fingerprint.system_fingerprint

        def chunk(choices: list[CompletionChoice]) -> Completion:
            return Completion(id=cid, created=created, model=self.model_name, choices=choices,
                              system_fingerprint=fp)

        deltas = {j.index: TextDeltas(j.params.stop) for j in jobs}
        offsets = dict.fromkeys(deltas, 0)
        results: dict[int, GenerationResult] = {}
        async for job, item in self.stream(jobs, reservation):
            if isinstance(item, StepEvent):
                text = deltas[job.index].delta(item.text, item.finished is not None)
                lp = (self._logprobs([item.logprob], offsets[job.index])
                      if item.logprob is not None else None)
                offsets[job.index] += sum(len(t) for t in lp.tokens) if lp else 0
                if text or lp is not None:
                    yield chunk([CompletionChoice(finish_reason=None, index=job.index, text=text,
                                                  logprobs=lp)])
            else:
                results[job.index] = item
                yield chunk([CompletionChoice(finish_reason=item.finish_reason, index=job.index,
                                              text="", verinfer=self.evidence(job, item))])
        final = chunk([])
        final.usage, final.verification = await self.final_fields(req.stream_options, jobs,
                                                                  results, finalize)
        if final.usage is not None or final.verification is not None:
            yield final
