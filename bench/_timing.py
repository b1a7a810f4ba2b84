"""What the bench scripts share about timing a verifier's re-execution (not a benchmark of
its own: `verinfer bench` lists no name that starts with an underscore)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ReplayTiming:
    generation: Any  # the engine's GenerationResult
    generate_s: float
    replay_s: float

    @property
    def ratio(self) -> float:
        """Verification cost: re-executing the request / generating it alone."""
        return self.replay_s / self.generate_s


def time_generate_then_replay(engine: Any, prompt: list[int], params: Any) -> ReplayTiming:
    """Generate ``prompt`` alone, then re-execute it as a verifier does (``engine.replay``),
    timing each. Stops the bench unless the replay reproduced the generation bit for bit —
    every token and every step's logits digest, what a verifier's ``out_hash`` rests on: the
    time of a re-execution that would not verify measures nothing."""
    t0 = time.perf_counter()
    gen = engine.generate(prompt, params)
    generate_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    rep = engine.replay(prompt, gen.token_ids, params)
    replay_s = time.perf_counter() - t0
    if not rep.matches or rep.step_digests != gen.step_digests:
        raise SystemExit(
            f"{type(engine).__name__}: the replay did not reproduce the decode bit for bit"
        )
    return ReplayTiming(gen, generate_s, replay_s)
