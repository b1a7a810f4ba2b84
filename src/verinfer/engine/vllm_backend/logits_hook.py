"""The logits hook: vLLM computes the logits, verinfer's rules choose the token.

A vLLM logits processor sees the float32 logits of every request that samples in a step, in
the process where vLLM runs. For each row of a verinfer request it

1. commits to the row's bits (``step_digests``: the same digest the own engine commits),
2. chooses the token by the protocol's sampling rule ``vi-sample-v2`` at the absolute position
   ``len(prompt) + len(output so far)`` (greedy: argmax, first index on ties),
3. computes the logprobs by ``vi-logprob-v1`` when the request asked for them, and
4. masks the row so that vLLM's own greedy sampler can only pick that token.

So vLLM's sampler, seeds and logprob code never decide a committed byte: a verifier needs the
same logits bits, nothing else from vLLM. vLLM's per-request seeded sampler was the other
option; its draws depend on vLLM's generator and kernels (on GPU: FlashInfer), which the
self-test cannot tell apart from the model, and it would make the sampling rule differ between
backends (docs/backends.md).

Rows of a prompt still being prefilled in chunks are sampled by vLLM and thrown away; they have
the same position as the real first token, which comes later and overwrites the record.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

import torch

from verinfer.engine.digest import step_digests
from verinfer.engine.logprobs import TokenLogprob, token_logprob
from verinfer.engine.sampling import sample
from verinfer.protocol.sampling_params import SamplingParams

#: The SamplingParams.extra_args key naming the verinfer request a vLLM request belongs to.
KEY = "verinfer_key"


@dataclass
class StepRecord:
    token_id: int
    digest: bytes
    logprob: TokenLogprob | None


@dataclass
class Track:
    """One verinfer request as the hook sees it: its rule parameters and what it chose."""

    params: SamplingParams
    top_logprobs: int | None
    prompt_len: int
    steps: dict[int, StepRecord] = field(default_factory=dict)  # by absolute position
    error: BaseException | None = None


class Tracks:
    """The registry shared by the engine thread (adds, reads) and the hook (writes)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_key: dict[str, Track] = {}

    def add(self, key: str, track: Track) -> None:
        with self._lock:
            self._by_key[key] = track

    def get(self, key: str) -> Track | None:
        with self._lock:
            return self._by_key.get(key)

    def pop(self, key: str) -> Track | None:
        with self._lock:
            return self._by_key.pop(key, None)


#: One registry per process: vLLM instantiates the hook class itself, so it finds the registry
#: here (one vLLM engine per process: its CPU worker patches torch globals anyway).
TRACKS = Tracks()


def choose(row: torch.Tensor, track: Track, position: int) -> StepRecord:
    """Steps 1-3 of the module doc for one float32 row."""
    logits = row.numpy()
    tok = sample(logits, track.params, position)
    digest = step_digests(row[None, :])[0]
    lp = token_logprob(logits, tok, track.top_logprobs) if track.top_logprobs is not None \
        else None
    return StepRecord(tok, digest, lp)


def _hook_class() -> type:
    """The LogitsProcessor subclass (built lazily: vllm imports only with the backend)."""
    from vllm.v1.sample.logits_processor import BatchUpdate, LogitsProcessor, MoveDirectionality

    class VerinferRuleHook(LogitsProcessor):
        def __init__(self, vllm_config: Any, device: torch.device, is_pin_memory: bool) -> None:
            # batch index -> (track, live list of the request's output token ids)
            self.rows: dict[int, tuple[Track, list[int]]] = {}

        def is_argmax_invariant(self) -> bool:
            return False  # it decides the token

        def update_state(self, batch_update: BatchUpdate | None) -> None:
            if batch_update is None:
                return
            for i in batch_update.removed:
                self.rows.pop(i, None)
            for i, params, _prompt, output_ids in batch_update.added:
                key = (params.extra_args or {}).get(KEY) if params is not None else None
                track = TRACKS.get(key) if isinstance(key, str) else None
                if track is None:
                    self.rows.pop(i, None)
                else:
                    self.rows[i] = (track, output_ids)
            for a, b, how in batch_update.moved:
                ra, rb = self.rows.pop(a, None), self.rows.pop(b, None)
                if ra is not None:
                    self.rows[b] = ra
                if how == MoveDirectionality.SWAP and rb is not None:
                    self.rows[a] = rb

        def apply(self, logits: torch.Tensor) -> torch.Tensor:
            for i, (track, output_ids) in self.rows.items():
                if i >= logits.shape[0]:
                    continue
                position = track.prompt_len + len(output_ids)
                try:
                    rec = choose(logits[i].to(torch.float32).contiguous(), track, position)
                except BaseException as e:  # fail this request, never the whole batch
                    track.error = e
                    continue
                track.steps[position] = rec
                logits[i].fill_(float("-inf"))
                logits[i, rec.token_id] = 0.0
            return logits

    return VerinferRuleHook


_HOOK: type | None = None


def hook_class() -> type:
    global _HOOK
    if _HOOK is None:
        _HOOK = _hook_class()
    return _HOOK
