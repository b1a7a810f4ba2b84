"""VllmEngine: vLLM's scheduler and kernels behind the interface of the own Engine.

The operator (generation.py: ``submit`` with ``on_step``), the evidence pipeline, the request
rule (``served_model``) and the verifier's re-execution job (``check_request``, ``replay``,
``output_state``, ``generate``) use it exactly like :class:`verinfer.engine.engine.Engine`,
of which it is a subclass: the request checks and the stop rule (EOS/EOT, stop strings,
max_tokens) are inherited, so they have one home.

What stays verinfer's: the model identity and tokenizer (read from the GGUF file: the model id
is its sha256), chat rendering and tokenization (vLLM receives token ids and never loads a
tokenizer), the stop rule, the sampling and logprob rules and the logit digests (the logits
hook). What is vLLM's: the forward pass and its batching — run in-process by ``LLMEngine``,
stepped by one thread of ours, so every step's outputs are read as they come.

Replay: whether one prefill over prompt + output reproduces decode's bits is a property of the
backend that the self-test measures (selftest.py); vLLM does not expose the full logits rows
of a prefill, so ``replay`` here re-decodes and compares, and keeps that decode for the
``generate`` call the verifier makes when the claim does not match (one decode either way).
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from verinfer.engine.engine import Engine, GenerationResult, ReplayResult, StepEvent
from verinfer.engine.export_hf import HfExport, ensure_export, read_export
from verinfer.engine.loader import LoadedModel, sha256_file
from verinfer.engine.logprobs import TokenLogprob
from verinfer.engine.stop_rule import FinishReason, StopState
from verinfer.engine.vllm_backend.fingerprint import vllm_fingerprint
from verinfer.engine.vllm_backend.logits_hook import KEY, TRACKS, Track, hook_class
from verinfer.engine.vllm_backend.settings import VllmSettings, require_vllm
from verinfer.engine.weights import Weights
from verinfer.errors import InvalidRequestError, ModelLoadError, VerinferError
from verinfer.protocol.hexutil import to_hex
from verinfer.protocol.sampling_params import SamplingParams

log = logging.getLogger(__name__)


class VllmBackendError(VerinferError):
    """vLLM did something the protocol cannot sign (e.g. it did not take the rule's token).
    A domain error of this side (not the caller's); the operator's API answers it 500."""

    code = "vllm_backend"


def light_model(gguf_path: Path) -> LoadedModel:
    """The GGUF model's identity, config and tokenizer without its weights (vLLM holds those)."""
    from verinfer.engine.gguf_file import GGUFFormatError, read_gguf
    from verinfer.engine.models.registry import config_from_gguf
    from verinfer.engine.tokenizer.load import tokenizer_from_gguf_fields
    from verinfer.errors import TokenizerError

    try:
        g = read_gguf(gguf_path)
        tokenizer = tokenizer_from_gguf_fields(g.fields)
    except (OSError, GGUFFormatError, TokenizerError) as e:
        raise ModelLoadError(f"{str(gguf_path)!r} is not a usable GGUF model: {e}") from e
    config = config_from_gguf(g.fields, tokenizer.vocab_size)
    name = str(g.fields.get("general.name") or gguf_path.stem)
    return LoadedModel(gguf_path, sha256_file(gguf_path), name, config, Weights({}, {}),
                       tokenizer)


@dataclass
class _Req:
    key: str
    prompt: list[int]
    params: SamplingParams
    future: Future[GenerationResult]
    track: Track
    top_logprobs: int | None
    on_step: Callable[[StepEvent], None] | None
    generated: list[int] = field(default_factory=list)
    digests: list[bytes] = field(default_factory=list)
    logprobs: list[TokenLogprob] = field(default_factory=list)
    text: str = ""
    finish: FinishReason | None = None
    vllm_id: str | None = None
    probe: dict[str, Any] | None = None  # self-test probe: extra vLLM params, raw output back
    stop: StopState | None = None  # the stop rule, one token at a time (set at the first)


class VllmEngine(Engine):
    """Thread-safe like Engine: ``submit`` from any thread; one thread steps vLLM."""

    def __init__(self, gguf_path: str | Path, export: HfExport | None = None,
                 settings: VllmSettings | None = None, *, max_seqs: int = 16,
                 max_context: int | None = None) -> None:
        # Engine.__init__ builds the own model from weights; this backend has none of its own
        self.settings = settings or VllmSettings(max_num_seqs=max_seqs)
        self.settings.apply_environment()
        require_vllm()
        path = Path(gguf_path)
        self.loaded = light_model(path)
        self.config = self.loaded.config
        self.tokenizer = self.loaded.tokenizer
        self.kernel_mode = "vllm"  # type: ignore[assignment]
        self.export = export if export is not None else ensure_export(path)
        if self.export.source_model_id != self.loaded.model_id:
            raise ModelLoadError(f"{self.export.path} is the export of "
                                 f"{to_hex(self.export.source_model_id)}, not of "
                                 f"{to_hex(self.loaded.model_id)}")
        read_export(self.export.path, verify=True)  # the weights vLLM loads are the manifest's
        self.max_context = min(max_context or self.config.context_length,
                               self.config.context_length, self.settings.max_model_len)
        self.max_seqs, self.max_batch_tokens = (self.settings.max_num_seqs,
                                                self.settings.max_num_batched_tokens)
        self.fingerprint = vllm_fingerprint(self.settings, self.export.weights_sha256)
        self._llm = self._start()
        self._cv = threading.Condition()
        self._incoming: list[_Req] = []
        self._live: dict[str, _Req] = {}  # by vLLM request id
        self._closed = False
        self._keys = itertools.count()
        self._memo: OrderedDict[tuple[Any, ...], GenerationResult] = OrderedDict()
        self._worker = threading.Thread(target=self._loop, name="verinfer-vllm", daemon=True)
        self._worker.start()
        self._close_at_exit()

    @classmethod
    def from_path(cls, path: str | Path, kernels: str = "vllm",
                  **kw: Any) -> VllmEngine:
        """The engine for a GGUF file (exported once into the cache): what a verifier's job
        builds from a model path and the backend name."""
        if kernels != "vllm":
            raise ValueError(f"VllmEngine runs the vllm backend, not {kernels!r}")
        return cls(path, **kw)

    def _start(self) -> Any:
        import torch
        from vllm.engine.arg_utils import EngineArgs
        from vllm.v1.engine.llm_engine import LLMEngine

        # The process is vLLM's: its CPU worker then freezes torch's thread count (it patches
        # torch.set_num_threads), so the fingerprint's thread count is set first — here and,
        # with the original function, in the stepping thread (OpenMP's thread count is per
        # thread, and vLLM's CPU attention checks that planning and running agree).
        self._set_threads = torch.set_num_threads
        self._set_threads(self.settings.threads)
        t0 = time.monotonic()
        args = EngineArgs(model=str(self.export.path), logits_processors=[hook_class()],
                          **self.settings.engine_kwargs())
        llm = LLMEngine.from_engine_args(args, enable_multiprocessing=False)
        log.info("vLLM engine started in %.1f s", time.monotonic() - t0)
        self.start_seconds = time.monotonic() - t0
        return llm

    # ---- requests ----------------------------------------------------------------------------
    def check_request(self, prompt_ids: Sequence[int], params: SamplingParams) -> None:
        """The engine's checks, and no vi-sample-v3 option: the logits hook draws by
        vi-sample-v2 only (logits_hook.py), so a penalty, bias or grammar would be dropped."""
        if params.extended:
            raise InvalidRequestError("presence/frequency penalties, logit_bias and "
                                      "response_format json_object/json_schema need sampling "
                                      "rule vi-sample-v3, which the vLLM backend does not run",
                                      param="response_format" if params.grammar is not None
                                      else "logit_bias" if params.logit_bias
                                      else "presence_penalty")
        super().check_request(prompt_ids, params)

    def submit(self, prompt_ids: Sequence[int], params: SamplingParams, *,
               top_logprobs: int | None = None,
               on_step: Callable[[StepEvent], None] | None = None
               ) -> Future[GenerationResult]:
        self.check_request(prompt_ids, params)
        self.check_top_logprobs(top_logprobs)
        fut: Future[GenerationResult] = Future()
        key = f"vi-{next(self._keys)}"
        track = Track(params, top_logprobs, len(prompt_ids))
        req = _Req(key, list(prompt_ids), params, fut, track, top_logprobs, on_step)
        with self._cv:
            if self._closed:
                raise RuntimeError("engine is closed")
            TRACKS.add(key, track)
            self._incoming.append(req)
            self._cv.notify()
        return fut

    def generate(self, prompt_ids: Sequence[int], params: SamplingParams, *,
                 top_logprobs: int | None = None) -> GenerationResult:
        memo = self._memo.pop(self._memo_key(prompt_ids, params, top_logprobs), None)
        if memo is not None:
            return memo
        return self.submit(prompt_ids, params, top_logprobs=top_logprobs).result()

    @staticmethod
    def _memo_key(prompt_ids: Sequence[int], params: SamplingParams,
                  top: int | None) -> tuple[Any, ...]:
        return (tuple(prompt_ids), repr(params), top)

    def close(self) -> None:
        with self._cv:
            self._closed = True
            self._cv.notify()
        self._worker.join(timeout=30)
        llm, self._llm = self._llm, None
        if llm is not None:
            with contextlib.suppress(Exception):  # best effort: the process may be ending
                llm.engine_core.shutdown()

    # ---- the stepping thread ----------------------------------------------------------------
    def _vllm_params(self, req: _Req) -> Any:
        from vllm import SamplingParams as VSP
        from vllm.sampling_params import RequestOutputKind

        if req.probe is not None:  # vLLM alone (no hook): its own greedy and logprobs
            return VSP(temperature=0.0, max_tokens=req.params.max_tokens, ignore_eos=True,
                       detokenize=False, output_kind=RequestOutputKind.FINAL_ONLY,
                       **req.probe)
        # greedy over the hook's masked row = the rule's token; our stop rule ends the request
        return VSP(temperature=0.0, max_tokens=req.params.max_tokens, ignore_eos=True,
                   detokenize=False, output_kind=RequestOutputKind.CUMULATIVE,
                   extra_args={KEY: req.key})

    def _loop(self) -> None:
        self._set_threads(self.settings.threads)
        while True:
            with self._cv:
                while not self._closed and not self._incoming and not self._live:
                    self._cv.wait()
                if self._closed:
                    break
                incoming, self._incoming = self._incoming, []
            for req in incoming:
                if req.future.cancelled():  # Engine.cancel before it reached vLLM: not added
                    self._fail(req, RuntimeError("cancelled"))
                    continue
                try:
                    # outputs and aborts name the request by the id we give (vLLM adds a
                    # suffix for its own internal id)
                    self._llm.add_request(req.key, {"prompt_token_ids": req.prompt},
                                          self._vllm_params(req))
                    req.vllm_id = req.key
                    self._live[req.key] = req
                except BaseException as e:
                    self._fail(req, e)
            # Cancelled ones are aborted before every step, not only at their next output: a
            # prompt still being prefilled gives none until its first token, so a client that
            # left right after sending a long prompt still cost its whole prefill.
            for req in [r for r in self._live.values() if r.future.cancelled()]:
                self._stop(req)
                self._fail(req, RuntimeError("cancelled"))
            try:
                outputs = self._llm.step()
            except BaseException as e:  # fail what is in flight, keep serving
                log.exception("vLLM step failed")
                for req in list(self._live.values()):
                    self._fail(req, e)
                self._live.clear()
                continue
            for out in outputs:
                live = self._live.get(out.request_id)
                if live is not None and live.probe is not None:
                    if out.finished:
                        self._live.pop(live.key, None)
                        live.future.set_result(out)
                elif live is not None:
                    self._take(live, list(out.outputs[0].token_ids) if out.outputs else [],
                               bool(out.finished))
        # a copy: _fail takes each out of _live (iterating the dict itself raised at the
        # first, and every other request in flight was left waiting for ever)
        for req in [*self._live.values(), *self._incoming]:
            self._fail(req, RuntimeError("engine closed"))

    def _fail(self, req: _Req, e: BaseException) -> None:
        TRACKS.pop(req.key)
        if req.vllm_id is not None:
            self._live.pop(req.vllm_id, None)
        if not req.future.done():
            req.future.set_exception(e)

    def _take(self, req: _Req, token_ids: list[int], vllm_finished: bool) -> None:
        if req.future.cancelled():  # Engine.cancel: abort it in vLLM too, no further token
            self._stop(req)
            self._fail(req, RuntimeError("cancelled"))  # only forgets it: the future is done
            return
        if req.track.error is not None:
            self._stop(req)
            self._fail(req, req.track.error)
            return
        while req.finish is None and len(req.generated) < len(token_ids):
            i = len(req.generated)
            position = len(req.prompt) + i
            rec = req.track.steps.get(position)
            if rec is None or rec.token_id != token_ids[i]:
                self._stop(req)
                self._fail(req, VllmBackendError(
                    f"vLLM produced token {token_ids[i]} at position {position}, the rule "
                    f"chose {None if rec is None else rec.token_id}: not signing it"))
                return
            req.generated.append(rec.token_id)
            req.digests.append(rec.digest)
            if rec.logprob is not None:
                req.logprobs.append(rec.logprob)
            if req.stop is None:
                req.stop = self.stop_state(req.params)
            req.finish = req.stop.push(rec.token_id)
            # The whole text is built only for a consumer (a stream) and at the finish, as in
            # the own engine: reading it every step copies the whole output every step (O(n^2)
            # per request; StopState.text).
            if req.on_step is not None:
                try:
                    req.on_step(StepEvent(i, rec.token_id, req.stop.text, req.finish,
                                          rec.logprob))
                except Exception:  # a broken consumer must not stall the others
                    req.on_step = None
        if req.finish is None and vllm_finished:
            # vLLM stopped (max_tokens) where our rule did not: cannot happen with equal
            # max_tokens; refuse rather than sign an unfinished answer
            self._fail(req, VllmBackendError("vLLM finished a request before the stop rule"))
            return
        if req.finish is not None:
            assert req.stop is not None  # a finish comes only from the stop rule
            req.text = req.stop.text
            if not vllm_finished:
                self._stop(req)
            TRACKS.pop(req.key)
            self._live.pop(req.vllm_id or "", None)
            with contextlib.suppress(InvalidStateError):  # cancelled meanwhile (cancel)
                req.future.set_result(GenerationResult(
                    req.prompt, list(req.generated), req.text, req.finish, list(req.digests),
                    req.params.seed,
                    list(req.logprobs) if req.top_logprobs is not None else None,
                    req.top_logprobs))

    def _stop(self, req: _Req) -> None:
        if req.vllm_id is not None:
            with contextlib.suppress(Exception):  # already gone
                self._llm.abort_request([req.vllm_id])

    # ---- replay (by re-decoding) -----------------------------------------------------------
    def replay(self, prompt_ids: Sequence[int], claimed_ids: Sequence[int],
               params: SamplingParams, *, top_logprobs: int | None = None) -> ReplayResult:
        self.check_replay(prompt_ids, claimed_ids, params, top_logprobs)
        gen = self.submit(prompt_ids, params, top_logprobs=top_logprobs).result()
        claim, mine = list(claimed_ids), gen.token_ids
        n = len(claim)
        mismatch = next((i for i, (a, b) in enumerate(zip(mine, claim, strict=False))
                         if a != b), None)
        if mismatch is None and len(mine) != n:
            mismatch = min(len(mine), n)
        checked = (mismatch + 1) if mismatch is not None else n
        key = self._memo_key(prompt_ids, params, top_logprobs)
        self._memo[key] = gen  # the verifier's decode, if the claim does not match
        while len(self._memo) > 4:
            self._memo.popitem(last=False)
        matches = mismatch is None
        return ReplayResult(mine[:checked], gen.step_digests[:checked],
                            gen.finish_reason if matches else None, matches, mismatch,
                            gen.logprobs if matches else None)

    # ---- self-test probe: does one prefill reproduce decode? ----------------------------------
    def _probe(self, prompt: Sequence[int], max_tokens: int, **extra: Any) -> Any:
        fut: Future[Any] = Future()
        key = f"probe-{next(self._keys)}"
        req = _Req(key, list(prompt), SamplingParams(temperature=0.0, max_tokens=max_tokens),
                   fut, Track(SamplingParams(), None, len(prompt)), None, None, probe=extra)
        with self._cv:
            self._incoming.append(req)
            self._cv.notify()
        return fut.result()

    def prefill_reproduces_decode(self, prompt: Sequence[int], n: int) -> tuple[bool, str]:
        """Decodes ``n`` greedy tokens asking vLLM for each sampled token's logprob, then runs
        ONE prefill over prompt + those tokens asking for the prompt logprobs, and compares
        the two float32 logprobs of every generated token bit for bit (vLLM's own
        log-softmax on both sides: equal rows give equal values). vLLM exposes no prefill
        logits rows, so this is the test of whether a verifier could replay instead of
        re-decoding; (result, first difference)."""
        dec = self._probe(prompt, n, logprobs=0)
        toks = list(dec.outputs[0].token_ids)
        dec_lp = [step[t].logprob for step, t in zip(dec.outputs[0].logprobs, toks,
                                                      strict=True)]
        # the prefill scores every token it is given: all n generated ones (prompt_logprobs has
        # one entry per prompt position), so the last one too
        pre = self._probe(list(prompt) + toks, 1, prompt_logprobs=0)
        p = len(prompt)
        for i, t in enumerate(toks):
            entry = pre.prompt_logprobs[p + i] if p + i < len(pre.prompt_logprobs) else None
            got = entry[t].logprob if entry is not None and t in entry else None
            if got is None or got != dec_lp[i]:
                return False, (f"step {i}: decode logprob {dec_lp[i]!r}, prefill {got!r}")
        return True, ""
