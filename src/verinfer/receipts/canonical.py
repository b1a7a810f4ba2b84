"""Canonical ExecResult, beside the ExecRequest; one byte encoding (deterministic CBOR).

The ExecRequest, the encoding (RFC 8949 §4.2.1 core deterministic CBOR) and the strict decoder
both structures share live in :mod:`verinfer.protocol.exec_request` (the protocol layer: the
request rule builds ExecRequests); import them from there. ``req_hash = sha256(ExecRequest
bytes)``, ``out_hash = sha256(ExecResult bytes)``. Why CBOR rather than RFC 8785 JSON is
written down in docs/receipts.md.
"""

from __future__ import annotations

import hashlib
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any, ClassVar, Literal, Protocol

from verinfer.protocol.errors import ReceiptFormatError

# The ExecRequest and the shared CBOR codec live in the protocol layer (the request rule builds
# ExecRequests); the ExecResult below uses them.
from verinfer.protocol.exec_request import (
    EXEC_VERSION,
    MAX_TOP_LOGPROBS,
    ExecRequest,
    _Canonical,
    _check_version,
    _freeze,
    _token_ids,
)
from verinfer.protocol.fields import check_bytes, show

FinishReason = Literal["stop", "length"]
# one output token's committed logprobs: (its logprob, ((id, logprob), ...) best first)
TokenLogprobs = tuple[float, tuple[tuple[int, float], ...]]


class Generation(Protocol):
    """What an ExecResult records of a generation: the engine's ``GenerationResult``, read
    structurally so that receipts do not import the engine (the layer above them,
    docs/architecture.md). ``logprobs`` entries have ``.logprob`` and ``.top``."""

    token_ids: list[int]
    text: str
    finish_reason: FinishReason

    @property
    def logit_digest(self) -> bytes: ...
    @property
    def logprobs(self) -> Sequence[Any] | None: ...


def _freeze_logprobs(value: list[Any]) -> tuple[Any, ...]:
    """:func:`_freeze` for ExecResult.logprobs, with a fast path for the expected shape
    ``[lp, [[id, lp], ...]]`` (a 1,000-token, top-20 result has 63,000 arrays)."""
    out: list[object] = []
    for e in value:
        if type(e) is list and len(e) == 2 and type(e[1]) is list:
            out.append((e[0], tuple([tuple(p) if type(p) is list else p for p in e[1]])))
        else:
            out.append(_freeze(e))
    return tuple(out)


_MIN_FLOAT = -sys.float_info.max


def _logprob_value(value: object, field: str) -> float:
    # a log-probability: a finite float <= 0 (rule vi-logprob-v1 never gives more)
    if type(value) is not float or not _MIN_FLOAT <= value <= 0.0:  # (NaN fails both)
        raise ReceiptFormatError(f"{field} must be a finite float <= 0, got {show(value)}",
                                 param="logprobs")
    return value


def _logprobs(value: object, n_tokens: int) -> None:
    """Shape of ExecResult.logprobs: one (logprob, top) per output token; every ``top`` has
    the same length k <= MAX_TOP_LOGPROBS of distinct u32 ids. Whether the values are the
    right ones is what re-execution decides."""
    if not isinstance(value, tuple) or len(value) != n_tokens:
        raise ReceiptFormatError(f"logprobs must hold one entry per output token "
                                 f"({n_tokens}), got {show(value, 80)}", param="logprobs")
    k: int | None = None
    for i, entry in enumerate(value):
        if not (isinstance(entry, tuple) and len(entry) == 2 and isinstance(entry[1], tuple)):
            raise ReceiptFormatError(f"logprobs[{i}] must be (logprob, top), got {show(entry, 80)}",
                                     param="logprobs")
        lp, top = entry
        _logprob_value(lp, f"logprobs[{i}]")
        if k is None:
            k = len(top)
            if k > MAX_TOP_LOGPROBS:
                raise ReceiptFormatError(f"logprobs: at most {MAX_TOP_LOGPROBS} alternatives "
                                         f"per token, got {k}", param="logprobs")
        elif len(top) != k:
            raise ReceiptFormatError(f"logprobs[{i}] has {len(top)} alternatives, the first "
                                     f"token {k}", param="logprobs")
        ids = set()
        for pair in top:
            if not (type(pair) is tuple and len(pair) == 2 and type(pair[0]) is int
                    and 0 <= pair[0] < 2**32 and pair[0] not in ids):
                raise ReceiptFormatError(f"logprobs[{i}]: alternative {show(pair, 60)} is not a "
                                         "(distinct u32 id, logprob) pair", param="logprobs")
            ids.add(pair[0])
            v = pair[1]
            if type(v) is not float or not _MIN_FLOAT <= v <= 0.0:
                _logprob_value(v, f"logprobs[{i}]")  # raises with the message


@dataclass(frozen=True)
class ExecResult(_Canonical):
    """What the engine produced: reproducible bit for bit by any honest re-execution.

    ``text_sha256`` is sha256 of the UTF-8 output text the client receives (for a stream: the
    concatenated ``delta.content`` bytes, see :class:`verinfer.receipts.streaming.StreamHasher`).
    ``logit_digest`` is the engine's roll-up of every step's logit digest.
    ``logprobs`` (None when the request asked for none) holds, per output token,
    ``(logprob, ((id, logprob), ...))``: the values the API returned, as float64 (CBOR floats
    in their shortest exact width, JSON numbers that round-trip exactly), by the engine's rule
    vi-logprob-v1 (engine/logprobs.py), so a verifier recomputes them bit for bit.
    """

    output_token_ids: tuple[int, ...]
    finish_reason: FinishReason
    logit_digest: bytes
    text_sha256: bytes
    logprobs: tuple[TokenLogprobs, ...] | None = None
    version: int = EXEC_VERSION

    KEYS: ClassVar[tuple[str, ...]] = (
        "version", "output_token_ids", "finish_reason", "logit_digest", "text_sha256",
        "logprobs")
    BYTES32: ClassVar[tuple[str, ...]] = ("logit_digest", "text_sha256")
    TUPLES: ClassVar[tuple[str, ...]] = ("output_token_ids",)

    def __post_init__(self) -> None:
        _check_version(self.version, "ExecResult")
        if self.logprobs is not None:
            _logprobs(self.logprobs, len(self.output_token_ids))
        _token_ids(self.output_token_ids, "output_token_ids", allow_empty=True)
        if self.finish_reason not in ("stop", "length"):
            raise ReceiptFormatError(f"finish_reason must be 'stop' or 'length', got "
                                     f"{show(self.finish_reason)}", param="finish_reason")
        check_bytes(self.logit_digest, 32, "logit_digest")
        check_bytes(self.text_sha256, 32, "text_sha256")

    @classmethod
    def _convert(cls, kw: dict[str, Any]) -> dict[str, Any]:
        if isinstance(kw.get("logprobs"), list):
            kw = {**kw, "logprobs": _freeze_logprobs(kw["logprobs"])}
        return kw

    def to_json(self) -> dict[str, Any]:
        out = super().to_json()
        if self.logprobs is not None:
            out["logprobs"] = [[lp, [list(pair) for pair in top]] for lp, top in self.logprobs]
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ExecResult:
        lps = data.get("logprobs") if isinstance(data, Mapping) else None
        if isinstance(lps, list):  # JSON writers may print 0.0 as 0: floats are floats here
            def fl(v: object) -> object:
                return float(v) if type(v) is int else v

            def entry(e: object) -> object:
                if not (isinstance(e, list) and len(e) == 2 and isinstance(e[1], list)):
                    return e
                return [fl(e[0]), [[p[0], fl(p[1])] if isinstance(p, list) and len(p) == 2
                                   else p for p in e[1]]]

            data = {**data, "logprobs": [entry(e) for e in lps]}
        return super().from_json(data)

    @classmethod
    def from_generation(cls, result: Generation, *, version: int = EXEC_VERSION
                        ) -> ExecResult:
        """The result the engine produced; its logprobs are exactly the GenerationResult's
        (the same float objects the API response is built from)."""
        lps = None
        if result.logprobs is not None:
            lps = tuple((lp.logprob, tuple(lp.top)) for lp in result.logprobs)
        return cls(output_token_ids=tuple(result.token_ids), finish_reason=result.finish_reason,
                   logit_digest=result.logit_digest,
                   text_sha256=hashlib.sha256(result.text.encode()).digest(),
                   logprobs=lps, version=version)

    def matches_text(self, text: str) -> bool:
        return hashlib.sha256(text.encode()).digest() == self.text_sha256


assert {f.name for f in fields(ExecRequest)} == {*ExecRequest.KEYS, *ExecRequest.OPTIONAL_FIELDS}
assert {f.name for f in fields(ExecResult)} == set(ExecResult.KEYS)
