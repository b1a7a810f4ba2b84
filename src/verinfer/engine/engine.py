"""The engine: a continuous-batching scheduler over a batch-invariant model, plus replay.

Requests join and leave between steps. Each step packs one decode token for every running
sequence and then prefill chunks of waiting prompts into one flat batch. Because every kernel
is batch invariant, how prompts are chunked and what shares a step never changes a bit.

Replay runs prompt + claimed output through one forward pass and recomputes, for every
generated step, the logits digest and the token the decode policy chooses.
"""

from __future__ import annotations

import atexit
import itertools
import threading
import weakref
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from verinfer.engine.digest import roll_up, step_digests
from verinfer.engine.fingerprint import EngineFingerprint, engine_fingerprint
from verinfer.engine.grammar import OutputState, grammar_tokenizer
from verinfer.engine.loader import LoadedModel, load_model
from verinfer.engine.logprobs import TokenLogprob, row_logprobs, token_logprob
from verinfer.engine.models.common import Batch, KVCache, Segment
from verinfer.engine.models.gemma3 import Gemma3
from verinfer.engine.models.llama import Llama
from verinfer.engine.models.registry import model_class
from verinfer.engine.ops import KernelMode, Ops, make_ops
from verinfer.engine.sampling import sample, sample_rows
from verinfer.engine.stop_rule import FinishReason, StopState, stop_rule
from verinfer.errors import ContextLengthExceededError, InvalidRequestError
from verinfer.protocol.exec_request import MAX_TOP_LOGPROBS  # the ExecRequest's bound, one place
from verinfer.protocol.sampling_params import SamplingParams

__all__ = ["Engine", "GenerationResult", "ReplayResult", "StepEvent"]

# Engines whose worker thread may still run. The worker is a daemon thread: one still inside a
# torch or kernel call (the GIL released) when the interpreter finalizes is ended by
# pthread_exit, whose unwinding through C++ noexcept frames aborts the whole process
# ("terminate called without an active exception", exit 134) — after a CLI has printed its
# answer, so `verinfer reproduce`'s exit code said crash instead of its verdict. Every live
# engine is therefore closed at exit, before the interpreter finalizes.
_LIVE_ENGINES: weakref.WeakSet[Engine] = weakref.WeakSet()


@atexit.register
def _close_live_engines() -> None:
    for engine in list(_LIVE_ENGINES):
        engine.close()


def _settle(fut: Future[GenerationResult], result: GenerationResult | None = None, *,
            error: BaseException | None = None) -> None:
    """Completes ``fut`` unless it is already done. A future may be cancelled from another
    thread at any moment (``Engine.cancel``); completing it then raises InvalidStateError,
    which inside a step would fail every other request of that step."""
    try:
        if error is not None:
            fut.set_exception(error)
        else:
            fut.set_result(result)  # type: ignore[arg-type]
    except InvalidStateError:
        pass  # INVARIANT: only a cancelled (or already failed) future is left as it is


@dataclass(frozen=True)
class StepEvent:
    """Handed to a request's ``on_step`` callback (on the engine thread) after every token."""

    index: int  # 0-based step
    token_id: int
    text: str  # the whole output so far, cut before any stop string
    finished: FinishReason | None
    logprob: TokenLogprob | None


@dataclass
class GenerationResult:
    prompt_ids: list[int]
    token_ids: list[int]  # every sampled token, including a final EOS
    text: str  # decoded output, cut before any stop string, without special tokens
    finish_reason: FinishReason
    step_digests: list[bytes]
    seed: int
    logprobs: list[TokenLogprob] | None = None  # one per token when asked for (rule
    # vi-logprob-v1, engine/logprobs.py): what the API returns and the ExecResult commits
    top_logprobs: int | None = None  # how many alternatives were asked for (None: no logprobs)

    @property
    def logit_digest(self) -> bytes:
        return roll_up(self.step_digests)


@dataclass
class ReplayResult:
    policy_ids: list[int]  # the tokens the decode policy chooses, up to where it stops
    step_digests: list[bytes]  # for every claimed step that was checked
    finish_reason: FinishReason | None
    matches: bool  # the claim is exactly what the policy produces
    first_mismatch: int | None
    # with top_logprobs: the logprobs of the claimed tokens when the claim matches, computed
    # from the replay's logits by the decode's rule (so equal bits), else None
    logprobs: list[TokenLogprob] | None = None

    @property
    def logit_digest(self) -> bytes:
        return roll_up(self.step_digests)


@dataclass
class _Seq:
    prompt: list[int]
    params: SamplingParams
    future: Future[GenerationResult]
    stop: StopState  # the stop rule, one token at a time
    prefilled: int = 0
    generated: list[int] = field(default_factory=list)
    digests: list[bytes] = field(default_factory=list)
    finish: FinishReason | None = None
    top_logprobs: int | None = None  # None: no logprobs
    logprobs: list[TokenLogprob] = field(default_factory=list)
    on_step: Callable[[StepEvent], None] | None = None
    state: OutputState | None = None  # vi-sample-v3 requests: counts and grammar matcher
    # allocated when the scheduler starts the sequence, never at submit: a waiting request
    # holds its prompt ids only (issue 32.2: 128 queued jobs of one body had committed their
    # whole KV caches up front, ~36 GiB at the default window)
    cache: KVCache | None = None

    @property
    def tokens(self) -> int:
        """Positions its KV cache holds: prompt + max_tokens."""
        return len(self.prompt) + self.params.max_tokens


class Engine:
    """Thread-safe: ``submit`` from any thread; one worker thread runs the model."""

    def __init__(self, model: LoadedModel, kernels: KernelMode = "invariant", *,
                 max_seqs: int = 16, max_batch_tokens: int = 256,
                 max_context: int | None = None, device: str = "cpu",
                 ops: Ops | None = None) -> None:
        """``device``: ``cpu`` (the C++ kernels) or ``cuda`` (the Triton kernels,
        engine/triton_ops.py); ``ops``: an Ops built by the caller (tests, the GPU check's
        interpreter dry run), instead of the ``kernels`` Ops of ``device``."""
        self.loaded = model
        self.config = model.config
        self.tokenizer = model.tokenizer
        self.kernel_mode: KernelMode = kernels
        if ops is None and device != "cpu":
            from verinfer.engine.triton_ops import device_ops

            ops = device_ops(kernels, device)
        self.ops = ops if ops is not None else make_ops(kernels)
        # where activations and KV caches live: the CPU, or the Ops' device
        self.device = getattr(self.ops, "device", torch.device("cpu"))
        off_cpu = hasattr(self.ops, "device")
        self.model: Gemma3 | Llama = model_class(model.config)(
            model.config, model.weights, self.ops)
        self.max_context = min(max_context or model.config.context_length,
                               model.config.context_length)
        self.max_seqs, self.max_batch_tokens = max_seqs, max_batch_tokens
        isa = "none"
        if kernels == "invariant" and not off_cpu:
            from verinfer.engine import kernels as k

            isa = k.isa()
        self.fingerprint: EngineFingerprint = engine_fingerprint(
            kernels, isa, self.ops.linear_order, device_ops=self.ops if off_cpu else None)
        self._lock = threading.Lock()  # one forward pass at a time
        self._cv = threading.Condition()
        self._waiting: deque[_Seq] = deque()
        self._running: list[_Seq] = []
        self.steps = 0  # forward passes run by the scheduler (tests, metrics)
        self._closed = False
        self._worker = threading.Thread(target=self._loop, name="verinfer-engine", daemon=True)
        self._worker.start()
        self._close_at_exit()

    @classmethod
    def from_path(cls, path: str | Path, kernels: KernelMode = "invariant",
                  **kw: Any) -> Engine:
        return cls(load_model(path), kernels, **kw)

    @property
    def model_id(self) -> bytes:
        """sha256 of the weight file, 32 bytes."""
        return self.loaded.model_id

    # ---- requests ---------------------------------------------------------------------------
    @staticmethod
    def check_top_logprobs(top_logprobs: int | None) -> None:
        """The ExecRequest's bound on ``top_logprobs``, refused alike by every backend's submit
        and replay."""
        if top_logprobs is not None and not 0 <= top_logprobs <= MAX_TOP_LOGPROBS:
            raise InvalidRequestError(
                f"top_logprobs must be in [0, {MAX_TOP_LOGPROBS}], got {top_logprobs}",
                param="top_logprobs")

    def check_request(self, prompt_ids: Sequence[int], params: SamplingParams) -> None:
        params.validate()
        if not prompt_ids:
            raise InvalidRequestError("the prompt is empty", param="prompt")
        vocab = self.config.vocab_size
        bad = [t for t in prompt_ids if not 0 <= t < vocab]
        if bad:
            raise InvalidRequestError(f"token id {bad[0]} is outside the vocabulary [0, {vocab})",
                                      param="prompt")
        if params.extended:
            self.output_state_v3(params)  # refuses a bias id outside the vocabulary, a grammar
            # this engine cannot compile exactly as the request names it
        need = len(prompt_ids) + params.max_tokens
        if need > self.max_context:
            raise ContextLengthExceededError(
                f"this model's maximum context length is {self.max_context} tokens; the prompt "
                f"has {len(prompt_ids)} and max_tokens asks for {params.max_tokens} more",
                param="max_tokens" if len(prompt_ids) < self.max_context else "messages")

    def output_state_v3(self, params: SamplingParams) -> OutputState:
        """A fresh vi-sample-v3 state for one output of ``params`` (engine/grammar.py)."""
        vocab = self.config.vocab_size
        bad = next((t for t, _ in params.logit_bias if t >= vocab), None)
        if bad is not None:
            raise InvalidRequestError(f"logit_bias names token id {bad}, outside the vocabulary "
                                      f"[0, {vocab})", param="logit_bias")
        gt = (grammar_tokenizer(self, self.tokenizer, vocab) if params.grammar is not None
              else None)
        return OutputState(params, gt)

    def submit(self, prompt_ids: Sequence[int], params: SamplingParams, *,
               top_logprobs: int | None = None,
               on_step: Callable[[StepEvent], None] | None = None
               ) -> Future[GenerationResult]:
        """Queues a request. ``top_logprobs`` (0..20) asks for per-token logprobs; ``on_step``
        is called on the engine thread after every token (keep it short and non-blocking)."""
        self.check_request(prompt_ids, params)
        self.check_top_logprobs(top_logprobs)
        fut: Future[GenerationResult] = Future()
        with self._cv:
            if self._closed:
                raise RuntimeError("engine is closed")
            self._waiting.append(_Seq(list(prompt_ids), params, fut,
                                      self.stop_state(params), top_logprobs=top_logprobs,
                                      on_step=on_step,
                                      state=(self.output_state_v3(params) if params.extended
                                             else None)))
            self._cv.notify()
        return fut

    def generate(self, prompt_ids: Sequence[int], params: SamplingParams, *,
                 top_logprobs: int | None = None) -> GenerationResult:
        return self.submit(prompt_ids, params, top_logprobs=top_logprobs).result()

    def cancel(self, fut: Future[GenerationResult]) -> bool:
        """Cancels the request ``submit`` returned ``fut`` for: its ``result()`` raises
        ``concurrent.futures.CancelledError`` at once, and the scheduler drops the sequence
        (and its KV cache) before its next step, no further token and no ``on_step``. False
        when it had already finished. ``fut.cancel()`` (e.g. an ``asyncio.wrap_future`` of it
        cancelled) does the same. For a client that went away: the operator issues no receipt
        for an unfinished generation, so nothing is owed (docs/engine.md)."""
        if not fut.cancel():
            return False
        with self._cv:
            self._cv.notify()
        return True

    @property
    def kv_bytes(self) -> int:
        """Bytes of KV cache the scheduler holds now (running sequences only: a waiting one
        has none yet)."""
        with self._cv:
            return sum(s.cache.nbytes for s in self._running if s.cache is not None)

    def kv_bytes_per_token(self) -> int:
        """KV cache bytes one position costs (keys and values, every layer, float32)."""
        cfg = self.config
        return 2 * cfg.n_layers * cfg.n_kv_heads * cfg.head_dim * 4

    @property
    def in_flight(self) -> int:
        """Requests waiting or running (a cancelled one counts until the scheduler drops it)."""
        with self._cv:
            return len(self._waiting) + len(self._running)

    def _close_at_exit(self) -> None:
        """Have this engine closed (its worker joined) when the interpreter exits."""
        _LIVE_ENGINES.add(self)

    def close(self) -> None:
        with self._cv:
            self._closed = True
            self._cv.notify()
        self._worker.join(timeout=30)

    # ---- scheduler --------------------------------------------------------------------------
    def _loop(self) -> None:
        while True:
            with self._cv:
                while not self._closed and not self._waiting and not self._running:
                    self._cv.wait()
                if self._closed:
                    break
                self._drop_cancelled()
                while self._waiting and len(self._running) < self.max_seqs:
                    self._running.append(self._waiting.popleft())
                running = list(self._running)
            if running:
                try:
                    self._allocate(running)  # outside the lock: submit never waits on it
                    self._step(running)
                except BaseException as e:  # fail the requests in flight, keep serving others
                    for s in running:
                        _settle(s.future, error=e)
                        s.finish = s.finish or "stop"
                self.steps += 1
            with self._cv:
                self._running = [s for s in self._running if s.finish is None]
        for s in itertools.chain(self._running, self._waiting):
            _settle(s.future, error=RuntimeError("engine closed"))

    def _allocate(self, running: list[_Seq]) -> None:
        """KV caches for the sequences that start now (prompt + max_tokens positions each):
        at most ``max_seqs`` caches exist at any time, whatever waits."""
        cfg = self.config
        for s in running:
            if s.cache is None:
                s.cache = KVCache(cfg.n_layers, cfg.n_kv_heads, cfg.head_dim, s.tokens,
                                  self.device)

    def _drop_cancelled(self) -> None:
        """Forget cancelled requests (``cancel``): waiting ones never start, running ones get
        no further step. Called with ``_cv`` held, between steps."""
        if any(s.future.cancelled() for s in self._waiting):
            self._waiting = deque(s for s in self._waiting if not s.future.cancelled())
        self._running = [s for s in self._running if not s.future.cancelled()]

    def _step(self, running: list[_Seq]) -> None:
        toks: list[int] = []
        segs: list[Segment] = []
        caches: list[KVCache] = []
        rows: list[int] = []
        owners: list[_Seq] = []
        budget = self.max_batch_tokens
        for s in running:  # decode tokens first: they keep latency flat for running requests
            if s.prefilled == len(s.prompt):
                pos = len(s.prompt) + len(s.generated) - 1
                segs.append(Segment(len(caches), pos, 1))
                assert s.cache is not None  # INVARIANT: _allocate ran before every step
                caches.append(s.cache)
                toks.append(s.generated[-1])
                rows.append(len(toks) - 1)
                owners.append(s)
                budget -= 1
        for s in running:  # then prefill chunks, as many as the token budget allows
            if s.prefilled < len(s.prompt) and budget > 0:
                n = min(budget, len(s.prompt) - s.prefilled)
                segs.append(Segment(len(caches), s.prefilled, n))
                assert s.cache is not None
                caches.append(s.cache)
                toks.extend(s.prompt[s.prefilled:s.prefilled + n])
                s.prefilled += n
                budget -= n
                if s.prefilled == len(s.prompt):
                    rows.append(len(toks) - 1)
                    owners.append(s)
        batch = Batch(torch.tensor(toks, dtype=torch.int64), segs, caches,
                      torch.tensor(rows, dtype=torch.int64))
        with self._lock:
            logits = self.model.forward(batch).cpu()  # sampling: the host's float32 row
        digests = step_digests(logits)
        for i, s in enumerate(owners):
            self._advance(s, logits[i], digests[i])

    def _advance(self, s: _Seq, row: torch.Tensor, digest: bytes) -> None:
        if s.future.cancelled():  # cancelled during this step: dropped before the next one
            return
        position = len(s.prompt) + len(s.generated)
        logits = row.numpy()
        if s.state is not None:  # vi-sample-v3
            tok = s.state.choose(logits, position)
            s.state.push(tok)
        else:
            tok = sample(logits, s.params, position)
        s.digests.append(digest)
        s.generated.append(tok)
        s.finish = s.stop.push(tok)
        lp = token_logprob(logits, tok, s.top_logprobs) if s.top_logprobs is not None else None
        if lp is not None:
            s.logprobs.append(lp)
        if s.on_step is not None:  # the whole text is built only for a consumer (a stream)
            try:
                s.on_step(StepEvent(len(s.generated) - 1, tok, s.stop.text, s.finish, lp))
            except Exception:  # a broken consumer must not stall the other sequences
                s.on_step = None
        if s.finish is not None:
            _settle(s.future, GenerationResult(
                s.prompt, list(s.generated), s.stop.text, s.finish, list(s.digests),
                s.params.seed,
                list(s.logprobs) if s.top_logprobs is not None else None, s.top_logprobs))

    def output_state(self, generated: Sequence[int], params: SamplingParams
                     ) -> tuple[FinishReason | None, str]:
        """(finish reason or None while running, output text) of a token sequence under the
        stop rules: what a verifier recomputes from claimed token ids (one pass over the whole
        list: the rule's definition, engine/stop_rule.py)."""
        if not generated:
            return None, ""
        return stop_rule(self.tokenizer, generated, params)

    def stop_state(self, params: SamplingParams) -> StopState:
        """The stop rule for one generation, evaluated token by token (decode, replay and every
        backend use it: equal to ``output_state`` of each prefix up to the first finish)."""
        return StopState(self.tokenizer, params)

    # ---- replay -----------------------------------------------------------------------------
    def check_replay(self, prompt_ids: Sequence[int], claimed_ids: Sequence[int],
                     params: SamplingParams, top_logprobs: int | None) -> None:
        """What every backend's replay refuses before running (one home: a verifier on any
        backend must refuse the same claims)."""
        self.check_top_logprobs(top_logprobs)
        if not claimed_ids:
            raise InvalidRequestError("nothing to replay: the claimed output is empty")
        self.check_request(prompt_ids, params)
        if len(claimed_ids) > params.max_tokens:
            raise InvalidRequestError("the claim is longer than max_tokens", param="max_tokens")

    def replay(self, prompt_ids: Sequence[int], claimed_ids: Sequence[int],
               params: SamplingParams, *, top_logprobs: int | None = None) -> ReplayResult:
        """One forward pass over prompt + claimed output; checks every step of the claim.
        With ``top_logprobs`` (0..20) a matching claim also gets its per-token logprobs."""
        self.check_replay(prompt_ids, claimed_ids, params, top_logprobs)
        p, n = len(prompt_ids), len(claimed_ids)
        cfg = self.config
        cache = KVCache(cfg.n_layers, cfg.n_kv_heads, cfg.head_dim, p + n, self.device)
        ids = list(prompt_ids) + list(claimed_ids[:-1])
        batch = Batch(torch.tensor(ids, dtype=torch.int64), [Segment(0, 0, len(ids))], [cache],
                      torch.arange(p - 1, p + n - 1, dtype=torch.int64))
        with self._lock:
            logits = self.model.forward(batch).cpu()  # sampling: the host's float32 row
        chosen: list[int] = []
        all_digests = step_digests(logits)
        if params.extended:  # vi-sample-v3: each draw reads the output before it, in order
            policy = self.output_state_v3(params).run(logits.numpy(), range(p, p + n),
                                                      claimed_ids)
        else:  # every draw depends only on its own row: the kernel draws them in parallel
            policy = sample_rows(logits, params, range(p, p + n))
        digests: list[bytes] = []
        finish: FinishReason | None = None
        rule = self.stop_state(params)
        for i in range(n):
            digests.append(all_digests[i])
            chosen.append(policy[i])
            finish = rule.push(policy[i])
            if chosen[i] != claimed_ids[i] or finish is not None:
                break
        mismatch = next((i for i, (a, b) in enumerate(zip(chosen, claimed_ids, strict=False))
                         if a != b), None)
        if mismatch is None and len(chosen) != n:
            mismatch = len(chosen)  # the policy stops earlier than the claim
        if mismatch is None and finish is None:
            mismatch = n  # the claim stops where the policy would go on
        lps = None
        if mismatch is None and top_logprobs is not None:
            # row i of these logits is bit-identical to decode step i's (batch invariance,
            # which the digests above just confirmed), and the rule is a pure function of a row
            lps = row_logprobs(logits.numpy(), list(claimed_ids), top_logprobs)
        return ReplayResult(chosen, digests, finish, mismatch is None, mismatch, lps)

