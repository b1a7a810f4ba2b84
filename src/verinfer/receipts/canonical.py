"""Canonical ExecRequest / ExecResult and their one byte encoding (deterministic CBOR).

Encoding: RFC 8949 §4.2.1 core deterministic CBOR, as ``cbor2.dumps(obj, canonical=True)``
writes it: definite lengths, shortest integer heads, map keys sorted bytewise by their
encoding (for our text keys: shorter first, then lexicographic), floats in the shortest
IEEE 754 width that keeps the value. Each structure is one map whose keys are exactly the
field names below; hashes are 32-byte byte strings; absent optionals are ``null``.
Decoding re-encodes and compares, so trailing bytes, duplicate keys, long-form heads or wide
floats are all rejected as :class:`NonCanonicalEncodingError`.

``req_hash = sha256(ExecRequest bytes)``, ``out_hash = sha256(ExecResult bytes)``.
Why CBOR rather than RFC 8785 JSON is written down in docs/receipts.md.
"""

from __future__ import annotations

import hashlib
import math
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from functools import cached_property
from typing import TYPE_CHECKING, Any, ClassVar, Literal, Protocol, TypeVar

import cbor2

from verinfer.protocol import limits as _limits
from verinfer.receipts.errors import (
    NonCanonicalEncodingError,
    ReceiptFormatError,
    UnsupportedVersionError,
)
from verinfer.receipts.hexutil import check_bytes, check_uint, parse_hex, to_hex

if TYPE_CHECKING:
    from verinfer.engine.sampling import SamplingParams

# Version 2 added the logprobs (ExecRequest.top_logprobs, ExecResult.logprobs). Version 1
# structures still decode and re-encode byte for byte (they have neither key), so evidence
# sealed before the change stays judgeable; new ones are written as version 2.
EXEC_VERSION = 2
EXEC_VERSIONS = (1, 2)
# from the one limits table (verinfer.protocol.limits), which the request rule applies
MAX_STOP = _limits.MAX_STOP
MAX_TOP_LOGPROBS = _limits.MAX_TOP_LOGPROBS  # per output token; the engine takes it from here
FinishReason = Literal["stop", "length"]
# one output token's committed logprobs: (its logprob, ((id, logprob), ...) best first)
TokenLogprobs = tuple[float, tuple[tuple[int, float], ...]]
_T = TypeVar("_T", bound="_Canonical")


class Generation(Protocol):
    """What an ExecResult records of a generation: the engine's ``GenerationResult``, read
    structurally so that receipts do not import the engine (the layer above them,
    docs/architecture.md). ``logprobs`` entries have ``.logprob`` and ``.top``."""

    token_ids: list[int]
    text: str
    finish_reason: FinishReason

    @property
    def logit_digest(self) -> str: ...
    @property
    def logprobs(self) -> Sequence[Any] | None: ...


def encode_canonical(obj: object) -> bytes:
    return cbor2.dumps(obj, canonical=True)


def _token_ids(value: object, field: str, *, allow_empty: bool) -> tuple[int, ...]:
    if not isinstance(value, tuple):
        raise ReceiptFormatError(f"{field} must be a tuple of token ids, got {value!r}",
                                 param=field)
    if not value and not allow_empty:
        raise ReceiptFormatError(f"{field} must not be empty", param=field)
    bad = [t for t in value if type(t) is not int] if set(map(type, value)) - {int} else []
    if not bad and value and (min(value) < 0 or max(value) >= 2**32):
        bad = [t for t in value if not 0 <= t < 2**32]
    if bad:
        raise ReceiptFormatError(f"{field}: token id {bad[0]!r} is not an integer in [0, 2^32)",
                                 param=field)
    return value


def _float(value: object, field: str, lo: float, hi: float, *, lo_open: bool = False) -> float:
    if type(value) is not float or not math.isfinite(value):
        raise ReceiptFormatError(f"{field} must be a finite float, got {value!r}", param=field)
    if not (lo < value if lo_open else lo <= value) or value > hi:
        raise ReceiptFormatError(f"{field} must be in {'(' if lo_open else '['}{lo}, {hi}], "
                                 f"got {value!r}", param=field)
    return value


def _check_version(version: object, what: str) -> None:
    if type(version) is not int or version not in EXEC_VERSIONS:
        raise UnsupportedVersionError(f"unknown {what} version {version!r}", param="version")


def _freeze(value: object) -> object:
    """CBOR/JSON arrays → tuples, all the way down (validation then checks the shape)."""
    if isinstance(value, list):
        return tuple(_freeze(v) for v in value)
    return value


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
        raise ReceiptFormatError(f"{field} must be a finite float <= 0, got {value!r}",
                                 param="logprobs")
    return value


def _logprobs(value: object, n_tokens: int) -> None:
    """Shape of ExecResult.logprobs: one (logprob, top) per output token; every ``top`` has
    the same length k <= MAX_TOP_LOGPROBS of distinct u32 ids. Whether the values are the
    right ones is what re-execution decides."""
    if not isinstance(value, tuple) or len(value) != n_tokens:
        raise ReceiptFormatError(f"logprobs must hold one entry per output token "
                                 f"({n_tokens}), got {value!r:.80}", param="logprobs")
    k: int | None = None
    for i, entry in enumerate(value):
        if not (isinstance(entry, tuple) and len(entry) == 2 and isinstance(entry[1], tuple)):
            raise ReceiptFormatError(f"logprobs[{i}] must be (logprob, top), got {entry!r:.80}",
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
                raise ReceiptFormatError(f"logprobs[{i}]: alternative {pair!r:.60} is not a "
                                         "(distinct u32 id, logprob) pair", param="logprobs")
            ids.add(pair[0])
            v = pair[1]
            if type(v) is not float or not _MIN_FLOAT <= v <= 0.0:
                _logprob_value(v, f"logprobs[{i}]")  # raises with the message


class _Canonical:
    """Shared encode/decode for the frozen dataclasses below."""

    version: int
    KEYS: ClassVar[tuple[str, ...]]
    V2_KEYS: ClassVar[tuple[str, ...]] = ()  # keys that version 1 does not have
    BYTES32: ClassVar[tuple[str, ...]] = ()
    TUPLES: ClassVar[tuple[str, ...]] = ()
    FLOATS: ClassVar[tuple[str, ...]] = ()

    @classmethod
    def keys_for(cls, version: int) -> tuple[str, ...]:
        return cls.KEYS if version >= 2 else tuple(k for k in cls.KEYS if k not in cls.V2_KEYS)

    def as_map(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.keys_for(self.version)}

    @cached_property
    def canonical(self) -> bytes:
        return encode_canonical(self.as_map())

    @cached_property
    def hash(self) -> bytes:
        return hashlib.sha256(self.canonical).digest()

    @classmethod
    def _from_map(cls: type[_T], m: object, what: str) -> _T:
        if not isinstance(m, Mapping):
            raise ReceiptFormatError(f"{what} must be a map, got {type(m).__name__}")
        version = m.get("version")
        if type(version) is int and version not in EXEC_VERSIONS:
            raise UnsupportedVersionError(f"unknown {what} version {version!r}", param="version")
        keys = cls.keys_for(version if type(version) is int else EXEC_VERSION)
        if set(m) != set(keys):
            raise ReceiptFormatError(f"{what} keys must be exactly {sorted(keys)}, got "
                                     f"{sorted(map(str, m))}")
        kw = {k: tuple(m[k]) if k in cls.TUPLES and isinstance(m[k], list) else m[k]
              for k in keys}
        return cls(**cls._convert(kw))

    @classmethod
    def _convert(cls, kw: dict[str, Any]) -> dict[str, Any]:
        """Decoded (CBOR or JSON) values → the dataclass's types, before validation."""
        return kw

    @classmethod
    def from_canonical(cls: type[_T], data: bytes) -> _T:
        """Strict decode: the bytes must be exactly what :attr:`canonical` would produce."""
        what = cls.__name__
        if not isinstance(data, bytes):
            raise ReceiptFormatError(f"{what} bytes expected, got {type(data).__name__}")
        try:
            m = cbor2.loads(data)
        except Exception as e:  # cbor2 raises several types for truncated/garbled input
            raise ReceiptFormatError(f"{what}: not CBOR ({e}): {data[:32].hex()}...") from None
        obj = cls._from_map(m, what)
        if obj.canonical != data:
            raise NonCanonicalEncodingError(
                f"{what}: bytes are not the canonical encoding (got {len(data)} bytes "
                f"0x{data[:16].hex()}.., canonical is {len(obj.canonical)} bytes)")
        return obj

    # ---- JSON view (API responses, logs); not what is hashed -----------------------------------
    def to_json(self) -> dict[str, Any]:
        out = self.as_map()
        for k in self.BYTES32:
            if out[k] is not None:
                out[k] = to_hex(out[k])
        for k in self.TUPLES:
            out[k] = list(out[k])
        return out

    @classmethod
    def from_json(cls: type[_T], data: Mapping[str, Any]) -> _T:
        if not isinstance(data, Mapping):
            raise ReceiptFormatError(f"{cls.__name__} must be a JSON object, got {data!r}")
        m = dict(data)
        for k in cls.FLOATS:  # JSON writers may print 1.0 as 1
            if type(m.get(k)) is int:
                m[k] = float(m[k])
        for k in cls.BYTES32:
            if k in m and m[k] is not None:
                m[k] = parse_hex(m[k], 32, k)
        return cls._from_map(m, cls.__name__)


@dataclass(frozen=True)
class ExecRequest(_Canonical):
    """Everything that can change an output bit, and nothing else.

    Maps 1:1 onto what the engine consumes: the weights (``model_id``), the tokenizer
    (``tokenizer_hash``; it also fixes the EOS/EOT stop ids), the engine fingerprint (its
    canonical JSON string; ``engine_fingerprint_hash`` is what receipts carry), the prompt
    token ids after the chat template, and every :class:`SamplingParams` field.
    """

    model_id: bytes
    tokenizer_hash: bytes
    engine_fingerprint: str
    prompt_token_ids: tuple[int, ...]
    max_tokens: int
    temperature: float
    top_k: int
    top_p: float
    stop: tuple[str, ...]
    seed: int
    ignore_eos: bool
    prompt_commitments: bytes | None = None  # Merkle root of documents the prompt refers to
    # None: no logprobs; k: each output token's logprob plus its k most likely alternatives
    # (the ExecResult commits them, so they are part of what was asked). Version 2 only.
    top_logprobs: int | None = None
    version: int = EXEC_VERSION

    KEYS: ClassVar[tuple[str, ...]] = (
        "version", "model_id", "tokenizer_hash", "engine_fingerprint", "prompt_token_ids",
        "max_tokens", "temperature", "top_k", "top_p", "stop", "seed", "ignore_eos",
        "prompt_commitments", "top_logprobs")
    V2_KEYS: ClassVar[tuple[str, ...]] = ("top_logprobs",)
    BYTES32: ClassVar[tuple[str, ...]] = ("model_id", "tokenizer_hash", "prompt_commitments")
    TUPLES: ClassVar[tuple[str, ...]] = ("prompt_token_ids", "stop")
    FLOATS: ClassVar[tuple[str, ...]] = ("temperature", "top_p")

    def __post_init__(self) -> None:
        _check_version(self.version, "ExecRequest")
        if self.top_logprobs is not None and (
                type(self.top_logprobs) is not int
                or not 0 <= self.top_logprobs <= MAX_TOP_LOGPROBS):
            raise ReceiptFormatError(f"top_logprobs must be null or an integer in "
                                     f"[0, {MAX_TOP_LOGPROBS}], got {self.top_logprobs!r}",
                                     param="top_logprobs")
        if self.version == 1 and self.top_logprobs is not None:
            raise ReceiptFormatError("a version 1 ExecRequest has no top_logprobs",
                                     param="top_logprobs")
        check_bytes(self.model_id, 32, "model_id")
        check_bytes(self.tokenizer_hash, 32, "tokenizer_hash")
        if not isinstance(self.engine_fingerprint, str) or not self.engine_fingerprint:
            raise ReceiptFormatError("engine_fingerprint must be a non-empty string, got "
                                     f"{self.engine_fingerprint!r}", param="engine_fingerprint")
        _token_ids(self.prompt_token_ids, "prompt_token_ids", allow_empty=False)
        if type(self.max_tokens) is not int or self.max_tokens < 1:
            raise ReceiptFormatError(f"max_tokens must be an integer >= 1, got "
                                     f"{self.max_tokens!r}", param="max_tokens")
        check_uint(self.max_tokens, 32, "max_tokens")
        _float(self.temperature, "temperature", 0.0, 2.0)
        # -0.0 and 0.0 decode alike; keep one spelling so equal requests hash equal
        object.__setattr__(self, "temperature", self.temperature + 0.0)
        check_uint(self.top_k, 32, "top_k")
        _float(self.top_p, "top_p", 0.0, 1.0, lo_open=True)
        if (not isinstance(self.stop, tuple) or len(self.stop) > MAX_STOP
                or any(not isinstance(s, str) or not s for s in self.stop)):
            raise ReceiptFormatError(f"stop must be a tuple of up to {MAX_STOP} non-empty "
                                     f"strings, got {self.stop!r}", param="stop")
        check_uint(self.seed, 64, "seed")
        if type(self.ignore_eos) is not bool:
            raise ReceiptFormatError(f"ignore_eos must be a bool, got {self.ignore_eos!r}",
                                     param="ignore_eos")
        if self.prompt_commitments is not None:
            check_bytes(self.prompt_commitments, 32, "prompt_commitments")
        for name in ("engine_fingerprint", *self.stop):  # CBOR text must be valid UTF-8
            try:
                (self.engine_fingerprint if name == "engine_fingerprint" else name).encode()
            except UnicodeEncodeError:
                raise ReceiptFormatError(f"string is not valid Unicode: {name!r}") from None

    @property
    def engine_fingerprint_hash(self) -> bytes:
        """sha256 of the fingerprint string (UTF-8): the receipt's engineFingerprintHash."""
        return hashlib.sha256(self.engine_fingerprint.encode()).digest()

    @classmethod
    def from_params(cls, *, model_id: str | bytes, tokenizer_hash: str | bytes,
                    engine_fingerprint: str, prompt_token_ids: Sequence[int],
                    params: SamplingParams, prompt_commitments: bytes | None = None,
                    top_logprobs: int | None = None) -> ExecRequest:
        def b32(v: str | bytes, name: str) -> bytes:
            return parse_hex(v, 32, name) if isinstance(v, str) else v

        return cls(model_id=b32(model_id, "model_id"),
                   tokenizer_hash=b32(tokenizer_hash, "tokenizer_hash"),
                   engine_fingerprint=engine_fingerprint,
                   prompt_token_ids=tuple(prompt_token_ids), max_tokens=params.max_tokens,
                   temperature=float(params.temperature), top_k=params.top_k,
                   top_p=float(params.top_p), stop=tuple(params.stop), seed=params.seed,
                   ignore_eos=params.ignore_eos, prompt_commitments=prompt_commitments,
                   top_logprobs=top_logprobs)

    def sampling_params(self) -> SamplingParams:
        """The decode policy to re-execute with (verifiers)."""
        from verinfer.engine.sampling import SamplingParams

        return SamplingParams(max_tokens=self.max_tokens, temperature=self.temperature,
                              top_k=self.top_k, top_p=self.top_p, stop=self.stop,
                              seed=self.seed, ignore_eos=self.ignore_eos)


@dataclass(frozen=True)
class ExecResult(_Canonical):
    """What the engine produced: reproducible bit for bit by any honest re-execution.

    ``text_sha256`` is sha256 of the UTF-8 output text the client receives (for a stream: the
    concatenated ``delta.content`` bytes, see :class:`verinfer.receipts.streaming.StreamHasher`).
    ``logit_digest`` is the engine's roll-up of every step's logit digest.
    ``logprobs`` (version 2; None when the request asked for none) holds, per output token,
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
    V2_KEYS: ClassVar[tuple[str, ...]] = ("logprobs",)
    BYTES32: ClassVar[tuple[str, ...]] = ("logit_digest", "text_sha256")
    TUPLES: ClassVar[tuple[str, ...]] = ("output_token_ids",)

    def __post_init__(self) -> None:
        _check_version(self.version, "ExecResult")
        if self.logprobs is not None:
            if self.version == 1:
                raise ReceiptFormatError("a version 1 ExecResult has no logprobs",
                                         param="logprobs")
            _logprobs(self.logprobs, len(self.output_token_ids))
        _token_ids(self.output_token_ids, "output_token_ids", allow_empty=True)
        if self.finish_reason not in ("stop", "length"):
            raise ReceiptFormatError(f"finish_reason must be 'stop' or 'length', got "
                                     f"{self.finish_reason!r}", param="finish_reason")
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
                   logit_digest=parse_hex(result.logit_digest, 32, "logit_digest"),
                   text_sha256=hashlib.sha256(result.text.encode()).digest(),
                   logprobs=lps, version=version)

    def matches_text(self, text: str) -> bool:
        return hashlib.sha256(text.encode()).digest() == self.text_sha256


assert {f.name for f in fields(ExecRequest)} == set(ExecRequest.KEYS)
assert {f.name for f in fields(ExecResult)} == set(ExecResult.KEYS)
