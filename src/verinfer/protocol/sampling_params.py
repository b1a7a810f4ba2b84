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
from verinfer.protocol.grammar import Grammar

MAX_SEED = _limits.MAX_SEED  # from the one limits table (verinfer.protocol.limits)
MAX_U32 = 2**32 - 1  # the receipts' canonical encoding holds top_k and max_tokens as u32
#: The sampling rule an ExecRequest names when it uses penalties, logit_bias or a grammar
#: (verinfer.engine.sampling defines it; a request without them is vi-sample-v2's).
EXTENDED_SAMPLER = "vi-sample-v3"


@dataclass(frozen=True)
class SamplingParams:
    max_tokens: int = 16
    temperature: float = 0.0
    top_k: int = 0  # 0 = no limit
    top_p: float = 1.0
    stop: tuple[str, ...] = field(default_factory=tuple)
    seed: int = 0
    ignore_eos: bool = False
    # sampling rule vi-sample-v3 (verinfer.engine.sampling): all neutral = exactly vi-sample-v2
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, bias), ids ascending, no 0.0
    grammar: Grammar | None = None  # structured output: the mask comes from it

    @property
    def extended(self) -> bool:
        """Uses any part of ``vi-sample-v3`` beyond ``vi-sample-v2``."""
        return bool(self.presence_penalty or self.frequency_penalty or self.logit_bias
                    or self.grammar is not None)

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
        for name in ("presence_penalty", "frequency_penalty"):
            v = getattr(self, name)
            if type(v) is not float or not _limits.MIN_PENALTY <= v <= _limits.MAX_PENALTY:
                raise InvalidRequestError(f"{name} must be a number in [{_limits.MIN_PENALTY}, "
                                          f"{_limits.MAX_PENALTY}], got {v!r}", param=name)
        check_logit_bias(self.logit_bias)
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


def check_logit_bias(bias: object) -> tuple[tuple[int, float], ...]:
    """The canonical form of a logit bias: up to MAX_LOGIT_BIAS_ENTRIES (id, value) pairs, ids
    strictly ascending (so one bias has one spelling), values finite, non-zero, in
    [-MAX_ABS_LOGIT_BIAS, MAX_ABS_LOGIT_BIAS]. Whether an id is in the vocabulary is the
    model's fact (the request rule and the engine check it)."""
    ok = isinstance(bias, tuple) and len(bias) <= _limits.MAX_LOGIT_BIAS_ENTRIES
    last = -1
    for pair in bias if isinstance(bias, tuple) and ok else ():
        if (not isinstance(pair, tuple) or len(pair) != 2 or type(pair[0]) is not int
                or type(pair[1]) is not float or not last < pair[0] < 2**32
                or not 0 < abs(pair[1]) <= _limits.MAX_ABS_LOGIT_BIAS):
            ok = False
            break
        last = pair[0]
    if not ok:
        raise InvalidRequestError(
            f"logit_bias must be up to {_limits.MAX_LOGIT_BIAS_ENTRIES} (token id, bias) pairs, "
            f"ids ascending, biases non-zero in [-{_limits.MAX_ABS_LOGIT_BIAS}, "
            f"{_limits.MAX_ABS_LOGIT_BIAS}]", param="logit_bias")
    return bias  # type: ignore[return-value]
