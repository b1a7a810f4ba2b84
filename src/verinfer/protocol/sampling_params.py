"""The decode policy an ExecRequest fixes: the engine's sampling parameters.

It lives in the protocol layer, below the receipts and the engine, because both sides of a
dispute build it from the same ExecRequest (``ExecRequest.sampling_params``) and the engine
draws tokens with it: one type, one set of bounds. The sampling rule itself (how a token is
drawn from logits with these parameters) is the engine's, :mod:`verinfer.engine.sampling`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from verinfer.errors import InvalidRequestError
from verinfer.protocol import limits as _limits

MAX_SEED = _limits.MAX_SEED  # from the one limits table (verinfer.protocol.limits)
MAX_U32 = 2**32 - 1  # the receipts' canonical encoding holds top_k and max_tokens as u32


@dataclass(frozen=True)
class SamplingParams:
    max_tokens: int = 16
    temperature: float = 0.0
    top_k: int = 0  # 0 = no limit
    top_p: float = 1.0
    stop: tuple[str, ...] = field(default_factory=tuple)
    seed: int = 0
    ignore_eos: bool = False

    def validate(self) -> SamplingParams:
        if not isinstance(self.max_tokens, int) or self.max_tokens <= 0:
            raise InvalidRequestError(
                f"max_tokens must be a positive integer, got {self.max_tokens!r}",
                param="max_tokens")
        if (not _limits.MIN_TEMPERATURE <= self.temperature <= _limits.MAX_TEMPERATURE
                or 0.0 < self.temperature < _limits.MIN_POSITIVE_TEMPERATURE):
            raise InvalidRequestError(
                f"temperature must be 0 or in [{_limits.MIN_POSITIVE_TEMPERATURE}, "
                f"{_limits.MAX_TEMPERATURE}], got {self.temperature!r}", param="temperature")
        if not 0 <= self.top_k <= MAX_U32:
            raise InvalidRequestError(f"top_k must be in [0, 2^32), got {self.top_k!r}",
                                      param="top_k")
        if self.max_tokens > MAX_U32:
            raise InvalidRequestError(f"max_tokens must be < 2^32, got {self.max_tokens!r}",
                                      param="max_tokens")
        if not 0.0 < self.top_p <= 1.0:
            raise InvalidRequestError(f"top_p must be in (0, 1], got {self.top_p!r}",
                                      param="top_p")
        if not 0 <= self.seed <= MAX_SEED:
            raise InvalidRequestError(f"seed must be in [0, 2^64), got {self.seed!r}",
                                      param="seed")
        if len(self.stop) > _limits.MAX_STOP or any(not s for s in self.stop):
            raise InvalidRequestError(f"stop takes up to {_limits.MAX_STOP} non-empty strings",
                                      param="stop")
        for s in self.stop:
            try:
                s.encode()
            except UnicodeEncodeError:  # a lone surrogate from JSON "\ud800": not text
                raise InvalidRequestError(f"stop string {s!r} is not valid Unicode",
                                          param="stop") from None
        return self

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0
