"""How the protocol reads a JSON number: one value, whatever its spelling.

``-0.0``, ``-0e5``, ``0`` and ``0.0`` are one temperature, and ``8.0`` is the integer 8. The
request rule (verinfer.protocol.request_rule) and the sampling options
(verinfer.protocol.sampling_options) both read numbers through these functions, so the two can
never read one body differently. Why it matters: the operator once derived a seed from ``-0.0``
while the verifier, reading the canonical ExecRequest, used ``0.0``, and an honest operator was
slashed.
"""

from __future__ import annotations

import math

from verinfer.errors import InvalidRequestError
from verinfer.protocol import limits as L


def canonical_float(value: object, param: str) -> float:
    """A JSON number as the one double it denotes: ints accepted, -0.0 becomes 0.0,
    booleans, strings, NaN and infinities refused."""
    if type(value) is bool or not isinstance(value, int | float):
        raise InvalidRequestError(f"{param} must be a number, got {json_kind(value)}", param=param)
    try:
        f = float(value)
    except OverflowError:
        raise InvalidRequestError(f"{param} is out of range", param=param) from None
    if not math.isfinite(f):
        raise InvalidRequestError(f"{param} must be a finite number", param=param)
    return f + 0.0  # IEEE: -0.0 + 0.0 == +0.0; every other value is unchanged


def canonical_int(value: object, param: str) -> int:
    """A JSON number that is an integer: ``8`` and ``8.0`` (and ``8e0``) are 8; a float is
    accepted only when it is exact (no fraction, |x| <= 2^53)."""
    if type(value) is bool:
        raise InvalidRequestError(f"{param} must be an integer, got a boolean", param=param)
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float) and value.is_integer() and abs(value) <= L.MAX_EXACT_FLOAT_INT:
        return int(value)
    raise InvalidRequestError(f"{param} must be an integer, got {json_kind(value)}", param=param)


def json_kind(value: object) -> str:
    """What a JSON value is, for an error message: "a string", "an integer", "1.5", ..."""
    if isinstance(value, float):
        return repr(value) if math.isfinite(value) else "a non-finite number"
    if isinstance(value, int) and not isinstance(value, bool):
        return "an integer"
    return {str: "a string", bool: "a boolean", list: "an array", dict: "an object",
            type(None): "null"}.get(type(value), type(value).__name__)
