"""The canonical ExecRequest and the one byte encoding (deterministic CBOR) it shares with the
ExecResult.

Encoding: RFC 8949 §4.2.1 core deterministic CBOR, as ``cbor2.dumps(obj, canonical=True)``
writes it: definite lengths, shortest integer heads, map keys sorted bytewise by their
encoding (for our text keys: shorter first, then lexicographic), floats in the shortest
IEEE 754 width that keeps the value. Each structure is one map whose keys are exactly the
field names; hashes are 32-byte byte strings; absent optionals are ``null``. Decoding
re-encodes and compares, so trailing bytes, duplicate keys, long-form heads or wide floats are
all rejected as :class:`NonCanonicalEncodingError`. ``req_hash = sha256(ExecRequest bytes)``.

The ExecRequest lives in the protocol layer because the request rule
(:mod:`verinfer.protocol.request_rule`) produces it and both sides of a dispute decode it
identically; :mod:`verinfer.receipts.canonical` re-exports it beside the ExecResult (whose
shape is the engine's output and stays with the receipts). Why CBOR rather than RFC 8785 JSON
is written down in docs/receipts.md.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any, ClassVar, TypeVar

import cbor2

from verinfer.protocol import limits as _limits
from verinfer.protocol.errors import (
    NonCanonicalEncodingError,
    ReceiptFormatError,
    UnsupportedVersionError,
)
from verinfer.protocol.fields import check_bytes, check_uint, parse_hex, show
from verinfer.protocol.grammar import Grammar
from verinfer.protocol.hexutil import to_hex
from verinfer.protocol.sampling_params import EXTENDED_SAMPLER, SamplingParams, check_logit_bias

# The one version of the ExecRequest/ExecResult maps, and the first that shipped (v0.1).
# Version 1 (no logprobs keys) existed only during development: no evidence was ever sealed
# in it, so it is refused like any unknown version rather than read by a second decoder.
EXEC_VERSION = 2
# from the one limits table (verinfer.protocol.limits), which the request rule applies
MAX_STOP = _limits.MAX_STOP
MAX_TOP_LOGPROBS = _limits.MAX_TOP_LOGPROBS  # per output token; the engine takes it from here
_T = TypeVar("_T", bound="_Canonical")


def encode_canonical(obj: object) -> bytes:
    return cbor2.dumps(obj, canonical=True)


#: Deepest nesting any canonical structure has: ExecResult map > logprobs > entry > top > pair
#: is 5, the envelope plaintext map 1 (the structures sit in it as byte strings).
MAX_CBOR_DEPTH = 8
MAX_CONTEXT_TOKENS = _limits.MAX_CONTEXT_TOKENS


@dataclass(frozen=True)
class CborBound:
    """The most CBOR data items (every head: integer, float, simple value, string, array, map,
    tag), containers (arrays, maps) and strings (text and bytes, map keys included) one valid
    structure holds, from its schema.

    Why: decoding builds one Python object per item, ~80 bytes for an empty array that costs one
    byte (``0x80``), so 32 MiB of honest-looking CBOR (the DA blob cap) took 2.4 GB and 17.6 s
    (measured) before the schema check could refuse it — every verifier of a committee at once.
    :func:`decode_cbor` counts the heads first (no object built) and refuses more than the
    structure's bound, so what a decode builds is at most what the largest valid structure
    builds. Containers and strings are the costly items (an empty array is ~80 bytes of
    objects, a two-byte string ~60; a number ~32), so they have bounds of their own."""

    items: int
    containers: int
    strings: int

    def __post_init__(self) -> None:
        if self.items < 1 or self.containers < 0 or self.strings < 0:  # one item at least
            raise ValueError(f"a CBOR bound needs items >= 1, containers and strings >= 0: "
                             f"{self}")


#: An ExecResult (receipts.canonical), the largest valid structure: its map (6 keys, 6 values),
#: up to MAX_CONTEXT_TOKENS output ids and, per output token, a logprobs entry ``[lp, top]``
#: (3 items: the array, lp, top) whose ``top`` holds up to MAX_TOP_LOGPROBS pairs ``[id, lp]``
#: (3 items each); containers: the map, the two arrays, and per token 2 + MAX_TOP_LOGPROBS;
#: strings: the 6 keys, ``finish_reason`` and the two hashes (+ 8 spare).
#: 8.4 M items / 2.9 M containers: a valid one that large peaks at ~670 MB to decode and check
#: (measured; it cannot even be published: 40 MB of CBOR, over the 32 MiB blob cap), and the
#: worst input the count lets through measured the same (docs/receipts.md).
EXEC_RESULT_CBOR = CborBound(
    items=1 + 2 * 6 + MAX_CONTEXT_TOKENS * (1 + 3 + 3 * MAX_TOP_LOGPROBS),
    containers=3 + MAX_CONTEXT_TOKENS * (2 + MAX_TOP_LOGPROBS), strings=6 + 3 + 8)
#: What :func:`decode_cbor` allows when its caller names no narrower bound: the largest valid
#: structure's.
MAX_CBOR = EXEC_RESULT_CBOR

#: The only CBOR tags a canonical structure may hold (an out-of-range ``seed`` arrives as one and
#: is refused by name by the field check): positive and negative bignums.
BIGNUM_TAGS = (2, 3)

# One-byte items: integers -24..23, empty strings/arrays/maps, simple values 0..23 (false, true,
# null, ...). A container whose children are all such is counted at C speed (an honest-looking
# bomb is mostly these).
_ONE_BYTE_ITEMS = bytes([*range(0x00, 0x18), *range(0x20, 0x38), 0x40, 0x60, 0x80, 0xa0,
                         *range(0xe0, 0xf8)])
# Below this many children a container's children are walked one by one (slicing costs more).
_BULK_MIN = 16


def _leaf_size(head: int) -> int:
    """Bytes of the whole item that starts with ``head`` when it is a number or a simple value
    (its size is in the head); 0 for the rest (strings, containers, tags, malformed heads)."""
    major, ai = head >> 5, head & 31
    if major in (0, 1, 7) and ai < 28:
        return 1 if ai < 24 else 1 + (1 << (ai - 24))
    return 0


_LEAF_SIZE = bytes(_leaf_size(h) for h in range(256))


def check_cbor_size(data: bytes, bound: CborBound, what: str) -> None:
    """Refuses ``data`` (:class:`ReceiptFormatError`) when its first CBOR item holds more items,
    containers or strings than ``bound``, or announces more items than it has bytes left,
    before any is decoded. Linear in ``len(data)``; memory: one slice of it at most. It walks
    the heads in order (a container's head only adds its children to the count still to read),
    skips string payloads, and counts a container whose children are all one-byte items with
    ``bytes.translate`` on their slice. Not a validator: heads that the decoder refuses anyway
    (indefinite lengths, reserved values, tags but bignums over a byte string) are refused here
    too, everything else is left to it."""
    n = len(data)
    if n <= min(bound.items, bound.containers, bound.strings):
        return  # every item takes at least one byte
    max_items, max_containers, max_strings = bound.items, bound.containers, bound.strings
    leaf_size, single = _LEAF_SIZE, _ONE_BYTE_ITEMS
    i = containers = strings = 0
    announced = remaining = 1  # items announced in all (the first, then children), not yet read
    try:
        while remaining:
            b = data[i]
            step = leaf_size[b]
            if step:  # the common case: a number, its size in its head
                i += step
                remaining -= 1
                continue
            ai = b & 31
            if ai < 24:
                val = ai
                i += 1
            elif ai < 28:
                w = 1 << (ai - 24)
                val = int.from_bytes(data[i + 1:i + 1 + w], "big")
                i += 1 + w
            else:
                raise ReceiptFormatError(f"{what}: not acceptable CBOR (indefinite length or "
                                         f"reserved head 0x{b:02x} at byte {i})")
            remaining -= 1
            major = b >> 5
            if major == 2 or major == 3:
                i += val
                strings += 1
                if strings > max_strings:
                    raise ReceiptFormatError(
                        f"{what}: more than {max_strings} CBOR strings (at byte {i}), more "
                        "than any valid one holds")
                continue
            if major == 6:  # a tag: one item follows
                # The decoder takes only bignums, over a byte string (_RefuseTags); refused
                # here on sight, since tags have no bound of their own: a chain of 8 M tag heads
                # (every one the costly path of this loop) took 2.3 s to reach the item bound.
                if val not in BIGNUM_TAGS:
                    raise ReceiptFormatError(f"{what}: CBOR tag {val} is not allowed (at byte "
                                             f"{i})")
                if data[i] >> 5 != 2:
                    raise ReceiptFormatError(f"{what}: CBOR tag {val} (a bignum) must hold a "
                                             f"byte string (at byte {i})")
                val = 1
            else:  # an array or a map
                containers += 1
                if major == 5:
                    val += val  # keys and values
                seg = data[i:i + val] if val >= _BULK_MIN else b""
                if seg and len(seg) == val and not seg.translate(None, single):
                    containers += seg.count(0x80) + seg.count(0xa0)  # all one-byte items
                    strings += seg.count(0x40) + seg.count(0x60)
                    announced += val
                    i += val
                    val = 0
                if containers > max_containers or strings > max_strings:
                    raise ReceiptFormatError(
                        f"{what}: more than {max_containers} CBOR arrays/maps or "
                        f"{max_strings} strings (at byte {i}), more than any valid one holds")
            announced += val
            remaining += val
            if announced > max_items:
                raise ReceiptFormatError(f"{what}: more than {max_items} CBOR items (at byte "
                                         f"{i}), more than any valid one holds")
            if remaining > n - i:  # each takes a byte at least: refused now, not at the end
                raise IndexError
    except IndexError:  # data[i] past the end, or the announced items cannot fit
        raise ReceiptFormatError(f"{what}: truncated CBOR ({remaining} more items announced, "
                                 f"{max(n - i, 0)} bytes left)") from None
    if i > n:
        raise ReceiptFormatError(f"{what}: truncated CBOR (its last item runs {i - n} bytes "
                                 "past the end)")


class _RefuseTags(dict[int, Any]):
    """``semantic_decoders`` that claims every tag number but the bignums (2, 3) and refuses it.

    cbor2 gives tags meaning by default: 28/29 share one decoded object between several places
    (a 300-byte map then holds a DAG whose tree has 3^40 nodes, and every walk over it — our
    list-to-tuple freeze, ``repr`` in an error message, ``hash`` of a key — never ends), 2/3 are
    bignums, 258 sets, 24 embedded CBOR, 256/25 string references. No canonical structure has a
    tag, so the strict decoder refuses them before they are built; the canonical re-encoding
    check comes too late for that (it runs after the walks). Bignums stay cbor2's (a plain int,
    linear in its bytes), so an out-of-range ``seed`` is refused by name by the field check."""

    BIGNUMS = BIGNUM_TAGS

    def __contains__(self, tag: object) -> bool:
        return tag not in self.BIGNUMS

    def __getitem__(self, tag: int) -> Any:
        if tag in self.BIGNUMS:
            raise KeyError(tag)

        def refuse(*_args: object) -> Any:
            raise cbor2.CBORDecodeError(f"CBOR tag {tag} is not allowed")
        return refuse

    def get(self, tag: int, default: Any = None) -> Any:
        return default if tag in self.BIGNUMS else self[tag]


def _refuse_tag(_decoder: object, tag: Any) -> Any:
    raise cbor2.CBORDecodeError(f"CBOR tag {getattr(tag, 'tag', '?')} is not allowed")


def decode_cbor(data: bytes, what: str, bound: CborBound = MAX_CBOR) -> Any:
    """The one decoder of CBOR from another party (the operator's envelope plaintext and the
    ExecRequest/ExecResult in it): what core deterministic CBOR of our maps can hold and
    nothing more — no tags but bignums, no indefinite lengths, no repeated or non-text/bytes
    map keys, nesting at most :data:`MAX_CBOR_DEPTH`, and no more items or containers than
    ``bound`` (the caller's schema; by default the largest valid structure's), counted before
    anything is built (:func:`check_cbor_size`). Decoding time is then linear in ``len(data)``
    and memory at most what a valid structure of that size needs. Raises
    :class:`ReceiptFormatError`. Callers still compare the canonical re-encoding (this decoder
    accepts e.g. long-form heads, which that check refuses)."""
    if not isinstance(data, bytes):
        raise ReceiptFormatError(f"{what} bytes expected, got {type(data).__name__}")
    check_cbor_size(data, bound, what)
    try:
        return cbor2.loads(data, semantic_decoders=_RefuseTags(), tag_hook=_refuse_tag,
                           allow_indefinite=False, allow_duplicate_keys=False,
                           strict_hashable_types=True, max_depth=MAX_CBOR_DEPTH)
    except Exception as e:  # cbor2 raises several types for truncated/garbled/refused input
        raise ReceiptFormatError(f"{what}: not acceptable CBOR ({str(e)[:200]}): "
                                 f"{data[:32].hex()}...") from None


def _token_ids(value: object, field: str, *, allow_empty: bool) -> tuple[int, ...]:
    if not isinstance(value, tuple):
        raise ReceiptFormatError(f"{field} must be a tuple of token ids, got {show(value)}",
                                 param=field)
    if not value and not allow_empty:
        raise ReceiptFormatError(f"{field} must not be empty", param=field)
    bad = [t for t in value if type(t) is not int] if set(map(type, value)) - {int} else []
    if not bad and value and (min(value) < 0 or max(value) >= 2**32):
        bad = [t for t in value if not 0 <= t < 2**32]
    if bad:
        raise ReceiptFormatError(f"{field}: token id {show(bad[0])} is not an integer in "
                                 "[0, 2^32)", param=field)
    return value


def _float(value: object, field: str, lo: float, hi: float, *, lo_open: bool = False) -> float:
    if type(value) is not float or not math.isfinite(value):
        raise ReceiptFormatError(f"{field} must be a finite float, got {show(value)}", param=field)
    if not (lo < value if lo_open else lo <= value) or value > hi:
        raise ReceiptFormatError(f"{field} must be in {'(' if lo_open else '['}{lo}, {hi}], "
                                 f"got {show(value)}", param=field)
    return value


def _check_version(version: object, what: str) -> None:
    if type(version) is not int or version != EXEC_VERSION:
        raise UnsupportedVersionError(f"{what} version {show(version)} is not supported (this "
                                      f"implementation reads version {EXEC_VERSION} only)",
                                      param="version")


def _freeze(value: object) -> object:
    """CBOR/JSON arrays → tuples, all the way down (validation then checks the shape)."""
    if isinstance(value, list):
        return tuple(_freeze(v) for v in value)
    return value


class _Canonical:
    """Shared encode/decode for the frozen dataclasses below."""

    version: int
    KEYS: ClassVar[tuple[str, ...]]
    BYTES32: ClassVar[tuple[str, ...]] = ()
    TUPLES: ClassVar[tuple[str, ...]] = ()
    FLOATS: ClassVar[tuple[str, ...]] = ()
    #: Keys a map holds only when their value is not the default (so every map written before
    #: they existed keeps its bytes and hash); a default written out is not canonical.
    OPTIONAL: ClassVar[tuple[str, ...]] = ()
    #: What a valid encoding holds at most (:func:`decode_cbor`); the ExecResult keeps the
    #: default, the largest (:data:`MAX_CBOR`).
    CBOR_BOUND: ClassVar[CborBound] = MAX_CBOR

    def as_map(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.KEYS}

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
        if "version" in m:  # the version first: an old map is refused as such, not as bad keys
            _check_version(m["version"], what)
        keys = cls.KEYS
        if set(m) - set(cls.OPTIONAL) != set(keys) or not set(m) <= {*keys, *cls.OPTIONAL}:
            raise ReceiptFormatError(f"{what} keys must be exactly {sorted(keys)} (and "
                                     f"optionally {sorted(cls.OPTIONAL)}), got "
                                     f"{sorted(map(str, m))}")
        kw = {k: tuple(m[k]) if k in cls.TUPLES and isinstance(m[k], list) else m[k]
              for k in m}
        return cls(**cls._convert(kw))

    @classmethod
    def _convert(cls, kw: dict[str, Any]) -> dict[str, Any]:
        """Decoded (CBOR or JSON) values → the dataclass's types, before validation."""
        return kw

    @classmethod
    def from_canonical(cls: type[_T], data: bytes) -> _T:
        """Strict decode: the bytes must be exactly what :attr:`canonical` would produce."""
        what = cls.__name__
        obj = cls._from_map(decode_cbor(data, what, cls.CBOR_BOUND), what)
        if obj.canonical != data:
            raise NonCanonicalEncodingError(
                f"{what}: bytes are not the canonical encoding (got {len(data)} bytes "
                f"0x{data[:16].hex()}.., canonical is {len(obj.canonical)} bytes)")
        return obj

    # ---- JSON view (API responses, logs); not what is hashed -----------------------------------
    def to_json(self) -> dict[str, Any]:
        out = self.as_map()
        for k in self.BYTES32:
            if out.get(k) is not None:
                out[k] = to_hex(out[k])
        for k in self.TUPLES:
            out[k] = list(out[k])
        return out

    @classmethod
    def from_json(cls: type[_T], data: Mapping[str, Any]) -> _T:
        if not isinstance(data, Mapping):
            raise ReceiptFormatError(f"{cls.__name__} must be a JSON object, got {show(data)}")
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
    # (the ExecResult commits them, so they are part of what was asked).
    top_logprobs: int | None = None
    version: int = EXEC_VERSION
    # Sampling rule vi-sample-v3 (docs/protocol.md "Penalties, logit_bias, structured
    # outputs"): written only when not neutral, with "sampler": "vi-sample-v3" beside them. A
    # map without them is a vi-sample-v2 request, byte for byte what it was before they existed.
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: tuple[tuple[int, float], ...] = ()
    grammar: Grammar | None = None

    KEYS: ClassVar[tuple[str, ...]] = (
        "version", "model_id", "tokenizer_hash", "engine_fingerprint", "prompt_token_ids",
        "max_tokens", "temperature", "top_k", "top_p", "stop", "seed", "ignore_eos",
        "prompt_commitments", "top_logprobs")
    OPTIONAL: ClassVar[tuple[str, ...]] = (
        "sampler", "presence_penalty", "frequency_penalty", "logit_bias", "grammar_spec",
        "grammar_engine", "grammar_hash")
    #: The dataclass fields behind OPTIONAL (the grammar's three keys are one Grammar).
    OPTIONAL_FIELDS: ClassVar[tuple[str, ...]] = (
        "presence_penalty", "frequency_penalty", "logit_bias", "grammar")
    BYTES32: ClassVar[tuple[str, ...]] = ("model_id", "tokenizer_hash", "prompt_commitments",
                                          "grammar_hash")
    TUPLES: ClassVar[tuple[str, ...]] = ("prompt_token_ids", "stop")
    FLOATS: ClassVar[tuple[str, ...]] = ("temperature", "top_p", "presence_penalty",
                                         "frequency_penalty")
    #: Its map, the prompt's ids (fewer than MAX_CONTEXT_TOKENS: the rule leaves room for one
    #: output token), up to MAX_STOP stop strings; 3 containers (the map, the prompt, the stop
    #: list); strings: the keys, the fingerprint, the stops, the hashes. Margins: 64 items, 8
    #: strings (a bignum ``seed`` is a tag and a byte string, refused by its field check by name).
    #: The optional keys add their map entries, the logit bias's list of [id, bias] pairs and
    #: three strings (sampler, grammar spec, grammar engine).
    CBOR_BOUND: ClassVar[CborBound] = CborBound(
        items=(1 + 2 * (len(KEYS) + len(OPTIONAL)) + MAX_CONTEXT_TOKENS + MAX_STOP
               + 1 + 3 * _limits.MAX_LOGIT_BIAS_ENTRIES + 64),
        containers=4 + _limits.MAX_LOGIT_BIAS_ENTRIES,
        strings=len(KEYS) + len(OPTIONAL) + 1 + MAX_STOP + len(BYTES32) + 3 + 8)

    @property
    def extended(self) -> bool:
        """Uses sampling rule vi-sample-v3 beyond vi-sample-v2 (penalties, bias, grammar)."""
        return bool(self.presence_penalty or self.frequency_penalty or self.logit_bias
                    or self.grammar is not None)

    @property
    def sampler(self) -> str | None:
        """The sampling rule the map names: vi-sample-v3 when extended, else None (the
        fingerprint's, vi-sample-v2)."""
        return EXTENDED_SAMPLER if self.extended else None

    def as_map(self) -> dict[str, Any]:
        out = {k: getattr(self, k) for k in self.KEYS}
        if self.extended:
            out["sampler"] = EXTENDED_SAMPLER
        if self.presence_penalty:
            out["presence_penalty"] = self.presence_penalty
        if self.frequency_penalty:
            out["frequency_penalty"] = self.frequency_penalty
        if self.logit_bias:
            out["logit_bias"] = [list(p) for p in self.logit_bias]
        if self.grammar is not None:
            out["grammar_spec"] = self.grammar.spec
            out["grammar_engine"] = self.grammar.engine
            out["grammar_hash"] = self.grammar.compiled
        return out

    @classmethod
    def _convert(cls, kw: dict[str, Any]) -> dict[str, Any]:
        sampler = kw.pop("sampler", None)
        if "logit_bias" in kw:
            lb = kw["logit_bias"]
            if not isinstance(lb, list | tuple) or not lb:
                raise ReceiptFormatError(f"logit_bias must be a non-empty list of pairs, got "
                                         f"{show(lb)}", param="logit_bias")
            kw["logit_bias"] = tuple(
                (p[0], float(p[1]) if type(p[1]) is int else p[1])
                if isinstance(p, list | tuple) and len(p) == 2 else p for p in lb)
        for k in ("presence_penalty", "frequency_penalty"):
            if k in kw and kw[k] == 0:
                raise ReceiptFormatError(f"{k} is written only when non-zero", param=k)
        g = {k: kw.pop(k) for k in ("grammar_spec", "grammar_engine", "grammar_hash") if k in kw}
        if g:
            if len(g) != 3 or not all(isinstance(g[k], str) for k in ("grammar_spec",
                                                                     "grammar_engine")):
                raise ReceiptFormatError("grammar_spec, grammar_engine and grammar_hash come "
                                         "together (strings and 32 bytes)", param="grammar")
            check_bytes(g["grammar_hash"], 32, "grammar_hash")
            kw["grammar"] = Grammar(g["grammar_spec"], g["grammar_engine"], g["grammar_hash"])
        extended = bool(kw.get("presence_penalty") or kw.get("frequency_penalty")
                        or kw.get("logit_bias") or "grammar" in kw)
        if (sampler is not None or extended) and sampler != EXTENDED_SAMPLER:
            raise ReceiptFormatError(f"sampler must be {EXTENDED_SAMPLER!r} exactly when a "
                                     f"vi-sample-v3 field is present, got {show(sampler)}",
                                     param="sampler")
        if sampler is not None and not extended:
            raise ReceiptFormatError("sampler is written only with a vi-sample-v3 field",
                                     param="sampler")
        return kw

    def __post_init__(self) -> None:
        _check_version(self.version, "ExecRequest")
        if self.top_logprobs is not None and (
                type(self.top_logprobs) is not int
                or not 0 <= self.top_logprobs <= MAX_TOP_LOGPROBS):
            raise ReceiptFormatError(f"top_logprobs must be null or an integer in "
                                     f"[0, {MAX_TOP_LOGPROBS}], got {show(self.top_logprobs)}",
                                     param="top_logprobs")
        check_bytes(self.model_id, 32, "model_id")
        check_bytes(self.tokenizer_hash, 32, "tokenizer_hash")
        if not isinstance(self.engine_fingerprint, str) or not self.engine_fingerprint:
            raise ReceiptFormatError("engine_fingerprint must be a non-empty string, got "
                                     f"{show(self.engine_fingerprint)}",
                                     param="engine_fingerprint")
        _token_ids(self.prompt_token_ids, "prompt_token_ids", allow_empty=False)
        if type(self.max_tokens) is not int or self.max_tokens < 1:
            raise ReceiptFormatError(f"max_tokens must be an integer >= 1, got "
                                     f"{show(self.max_tokens)}", param="max_tokens")
        check_uint(self.max_tokens, 32, "max_tokens")
        _float(self.temperature, "temperature", 0.0, 2.0)
        # -0.0 and 0.0 decode alike; keep one spelling so equal requests hash equal
        object.__setattr__(self, "temperature", self.temperature + 0.0)
        check_uint(self.top_k, 32, "top_k")
        _float(self.top_p, "top_p", 0.0, 1.0, lo_open=True)
        if (not isinstance(self.stop, tuple) or len(self.stop) > MAX_STOP
                or any(not isinstance(s, str) or not s for s in self.stop)):
            raise ReceiptFormatError(f"stop must be a tuple of up to {MAX_STOP} non-empty "
                                     f"strings, got {show(self.stop)}", param="stop")
        check_uint(self.seed, 64, "seed")
        for name in ("presence_penalty", "frequency_penalty"):
            _float(getattr(self, name), name, _limits.MIN_PENALTY, _limits.MAX_PENALTY)
            object.__setattr__(self, name, getattr(self, name) + 0.0)
        try:
            check_logit_bias(self.logit_bias)
        except Exception as e:
            raise ReceiptFormatError(str(getattr(e, "message", e)), param="logit_bias") from None
        if self.grammar is not None and (
                not isinstance(self.grammar, Grammar) or not self.grammar.spec
                or not isinstance(self.grammar.spec, str)
                or not isinstance(self.grammar.engine, str) or not self.grammar.engine
                or not isinstance(self.grammar.compiled, bytes)
                or len(self.grammar.compiled) != 32):
            raise ReceiptFormatError(f"grammar must be a Grammar(spec, engine, 32-byte hash), "
                                     f"got {show(self.grammar)}", param="grammar")
        if type(self.ignore_eos) is not bool:
            raise ReceiptFormatError(f"ignore_eos must be a bool, got {show(self.ignore_eos)}",
                                     param="ignore_eos")
        if self.prompt_commitments is not None:
            check_bytes(self.prompt_commitments, 32, "prompt_commitments")
        texts = (self.grammar.spec, self.grammar.engine) if self.grammar is not None else ()
        for name in ("engine_fingerprint", *self.stop, *texts):  # CBOR text must be UTF-8
            try:
                (self.engine_fingerprint if name == "engine_fingerprint" else name).encode()
            except UnicodeEncodeError:
                raise ReceiptFormatError(f"string is not valid Unicode: {show(name)}") from None

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
                   top_logprobs=top_logprobs, presence_penalty=float(params.presence_penalty),
                   frequency_penalty=float(params.frequency_penalty),
                   logit_bias=tuple(params.logit_bias), grammar=params.grammar)

    def sampling_params(self) -> SamplingParams:
        """The decode policy to re-execute with (verifiers)."""
        return SamplingParams(max_tokens=self.max_tokens, temperature=self.temperature,
                              top_k=self.top_k, top_p=self.top_p, stop=self.stop,
                              seed=self.seed, ignore_eos=self.ignore_eos,
                              presence_penalty=self.presence_penalty,
                              frequency_penalty=self.frequency_penalty,
                              logit_bias=self.logit_bias, grammar=self.grammar)
