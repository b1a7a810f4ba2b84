"""The request rule's reading of the options of sampling rule ``vi-sample-v3``: penalties,
``logit_bias`` and ``response_format`` (verinfer.protocol.request_rule calls these; the rule
itself is verinfer.engine.sampling's).

- ``presence_penalty``, ``frequency_penalty``: numbers in [-2, 2] (OpenAI's range), read as
  values (``-0.0`` is 0: no penalty).
- ``logit_bias``: an object whose keys are token ids written in decimal (``"0"``, ``"50256"``;
  no sign, no leading zero, so one id has one spelling) and whose values are numbers in
  [-100, 100]; at most 300 entries. A zero bias changes nothing and is dropped, so ``{"5": 0}``
  and ``{}`` are one request. Whether an id is in the vocabulary is checked against the model
  (:func:`check_bias_vocab`).
- ``response_format``: verinfer.protocol.grammar.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from verinfer.errors import InvalidRequestError
from verinfer.protocol import limits as L
from verinfer.protocol.grammar import Grammar, compile_grammar, response_format_spec
from verinfer.protocol.numbers import canonical_float

_TOKEN_ID = re.compile(r"0|[1-9][0-9]{0,9}")


@dataclass(frozen=True)
class SamplingOptions:
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: tuple[tuple[int, float], ...] = ()
    grammar: Grammar | None = None


def _number(value: object, param: str) -> float:
    return canonical_float(value, param)  # the rule's one reading of a JSON number


def penalty(value: object, param: str) -> float:
    v = _number(value, param)
    if not L.MIN_PENALTY <= v <= L.MAX_PENALTY:
        raise InvalidRequestError(f"{param} must be in [{L.MIN_PENALTY}, {L.MAX_PENALTY}], got "
                                  f"{v!r}", param=param)
    return v


def logit_bias(value: object) -> tuple[tuple[int, float], ...]:
    if not isinstance(value, Mapping):
        raise InvalidRequestError("logit_bias must be an object mapping token ids to biases",
                                  param="logit_bias")
    if len(value) > L.MAX_LOGIT_BIAS_ENTRIES:
        raise InvalidRequestError(f"logit_bias may hold at most {L.MAX_LOGIT_BIAS_ENTRIES} "
                                  f"entries, got {len(value)}", param="logit_bias")
    out: dict[int, float] = {}
    for key, bias in value.items():
        if not isinstance(key, str) or not _TOKEN_ID.fullmatch(key) or int(key) >= 2**32:
            raise InvalidRequestError(f"logit_bias key {str(key)[:40]!r} is not a token id "
                                      "(a decimal integer without sign or leading zeros)",
                                      param="logit_bias")
        b = _number(bias, "logit_bias")
        if not -L.MAX_ABS_LOGIT_BIAS <= b <= L.MAX_ABS_LOGIT_BIAS:
            raise InvalidRequestError(f"logit_bias values must be in [-{L.MAX_ABS_LOGIT_BIAS}, "
                                      f"{L.MAX_ABS_LOGIT_BIAS}], got {b!r} for token {key}",
                                      param="logit_bias")
        if b != 0.0:
            out[int(key)] = b
    return tuple(sorted(out.items()))


def check_bias_vocab(bias: tuple[tuple[int, float], ...], vocab_size: int) -> None:
    bad = next((t for t, _ in bias if t >= vocab_size), None)
    if bad is not None:
        raise InvalidRequestError(f"logit_bias names token id {bad}, outside the vocabulary "
                                  f"[0, {vocab_size})", param="logit_bias")


def sampling_options(body: Mapping[str, object]) -> SamplingOptions:
    """The vi-sample-v3 options of a (null-stripped) body; the defaults are neutral."""
    pp = penalty(body["presence_penalty"], "presence_penalty") \
        if "presence_penalty" in body else 0.0
    fp = penalty(body["frequency_penalty"], "frequency_penalty") \
        if "frequency_penalty" in body else 0.0
    lb = logit_bias(body["logit_bias"]) if "logit_bias" in body else ()
    grammar = None
    if "response_format" in body:
        spec = response_format_spec(body["response_format"])
        grammar = compile_grammar(spec) if spec is not None else None
    return SamplingOptions(pp, fp, lb, grammar)
