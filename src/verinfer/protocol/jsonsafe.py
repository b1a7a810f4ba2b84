"""The one parser for JSON that crossed a process boundary.

Why this exists: the stdlib decoder guards nesting only with the interpreter's recursion
limit, and importing eth-account (py_ecc) raises that limit to 100000 — at which ~95k
nested brackets overflow the C stack and the process dies with SIGSEGV. A crash is not an
exception: no ``try`` catches it. So every parser of untrusted bytes (HTTP bodies, shard and
DA answers, manifests, envelope plaintexts) goes through :func:`loads_untrusted`, which bounds
size and nesting depth *before* the decoder runs, whatever the recursion limit is.

Bytes are UTF-8 (RFC 8259 section 8.1), without a byte order mark: the stdlib decoder would
also read UTF-16 and UTF-32 (it guesses from the first bytes), but every bound here scans the
raw bytes as UTF-8, where an ASCII byte is always that character. In UTF-16 it is not: U+5C41
is the bytes ``41 5C``, whose ``5C`` reads as a backslash, so a quote after it looks escaped,
the shape count passes, and a body the scan called small parsed for 20-58 s on the operator's
event loop (issue 32.3). :func:`require_utf8` refuses any other encoding first.
"""

from __future__ import annotations

import json
import re
import sys
from typing import Any

from verinfer.errors import InvalidRequestError

#: Deepest nesting any verinfer message needs (an OpenAI body with tool schemas is ~10).
MAX_DEPTH = 64
#: Default size bound; callers with a tighter natural limit pass their own.
MAX_BYTES = 8 * 1024 * 1024
#: Where the interpreter's recursion limit is put back (the CPython default).
SAFE_RECURSION_LIMIT = 1000
#: Longest integer literal (digits) any party may send: a uint256 has 78. CPython refuses
#: int literals past ``sys.get_int_max_str_digits()`` (4300 by default, but 0 = unlimited, or
#: any value >= 640, via PYTHONINTMAXSTRDIGITS / -X int_max_str_digits): left to the
#: interpreter, one body could parse in an operator started with another setting and fail in
#: a verifier's enclave (a big integer in a field the rule ignores, e.g. chat ``max_tokens``
#: beside ``max_completion_tokens``), and an honest operator would be voted nonconformant.
MAX_INT_DIGITS = 100

# A JSON string, unrolled so the regex engine runs in linear time on any input.
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_NOT_BRACKET = bytes(c for c in range(256) if c not in b"[]{}")


class UntrustedJsonError(InvalidRequestError):
    """Bytes from another process are not acceptable JSON (too big, too deep, or invalid)."""

    code = "invalid_json"


def require_utf8(data: bytes, what: str = "JSON") -> str:
    """``data`` as text when it is UTF-8 without a byte order mark, else
    :class:`UntrustedJsonError` (code ``invalid_json``). Strict: invalid sequences and
    encoded surrogates are refused too, and so is a NUL byte (what UTF-16/32 of ASCII text
    is, byte for byte, besides the ASCII). Runs at C speed (~1 ms per MiB)."""
    if data[:3] == b"\xef\xbb\xbf":
        raise UntrustedJsonError(f"{what}: starts with a byte order mark; JSON text is UTF-8 "
                                 "without one (RFC 8259)")
    nul = data.find(b"\x00")
    if nul >= 0:  # valid UTF-8, but never in JSON text (escaped in strings, not whitespace):
        # UTF-16/32 of ASCII text is ASCII bytes and NULs, so no decode error would catch it
        raise UntrustedJsonError(f"{what}: a NUL byte at {nul}, so not UTF-8 JSON (UTF-16 or "
                                 "UTF-32?); JSON text is UTF-8 (RFC 8259)")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise UntrustedJsonError(f"{what}: not UTF-8 at byte {e.start}; JSON text is "
                                 "UTF-8 (RFC 8259)") from None


def json_shape(data: bytes, max_strings: int) -> tuple[int, int, int]:
    """(strings, containers, values) of JSON text, by C-speed byte operations only (no regex:
    ``re.sub`` over a million tiny strings takes a second, and this runs on the operator's event
    loop before any parser). Escapes are dropped first (``\\\\`` pairs, then ``\\"``: in
    valid JSON a backslash occurs only in strings, and pairing a run of backslashes from the
    left is how JSON reads it), so every quote left delimits a string. Past ``max_strings``
    strings it stops there (containers and values -1): splitting would cost a list item per
    string. Else containers are the ``[``/``{`` outside strings and values an upper bound on all
    values (commas outside strings + containers + 1). Invalid JSON gets some count; the parser
    refuses it anyway. The count is right only for UTF-8 (:func:`require_utf8`): in UTF-16 a
    character's second byte can be a backslash or a quote."""
    clean = data.replace(b"\\\\", b"").replace(b'\\"', b"")
    strings = clean.count(b'"') // 2
    if strings > max_strings:
        return strings, -1, -1
    bare = b"".join(clean.split(b'"')[::2])
    containers = bare.count(b"[") + bare.count(b"{")
    return strings, containers, bare.count(b",") + containers + 1


def check_shape(data: bytes, *, strings: int, containers: int, values: int,
                what: str = "JSON") -> None:
    """Refuses (UntrustedJsonError) JSON text with more strings, containers (arrays and
    objects) or values than the bounds, counted by :func:`json_shape` before any parser runs:
    a parser builds one object per value, so a body of small values costs far more to parse
    than its size suggests (16 MiB of ``[[],[],…]``: 5.6 M lists, ~1 GB)."""
    found_s, found_c, found_v = json_shape(data, strings)
    if found_s > strings:
        raise UntrustedJsonError(f"{what}: more than {strings} strings")
    if found_c > containers:
        raise UntrustedJsonError(f"{what}: {found_c} arrays/objects, the limit is {containers}")
    if found_v > values:
        raise UntrustedJsonError(f"{what}: up to {found_v} values, the limit is {values}")


def max_depth(data: bytes) -> int:
    """Deepest bracket nesting of ``data`` (brackets inside strings do not count)."""
    brackets = _STRING.sub(b"", data).translate(None, _NOT_BRACKET)
    depth = deepest = 0
    for b in brackets:
        if b in (0x5B, 0x7B):  # [ {
            depth += 1
            if depth > deepest:
                deepest = depth
        else:
            depth -= 1
    return deepest


def _unique_object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"repeated key {key!r}")
        out[key] = value
    return out


def _parse_int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_INT_DIGITS:
        raise ValueError(f"an integer of {len(text.lstrip('-'))} digits (the limit is "
                         f"{MAX_INT_DIGITS})")
    return int(text)


def _cap_recursion() -> None:
    if sys.getrecursionlimit() > SAFE_RECURSION_LIMIT:
        sys.setrecursionlimit(SAFE_RECURSION_LIMIT)


def loads_untrusted(
    data: bytes | bytearray | memoryview | str,
    *,
    max_bytes: int = MAX_BYTES,
    depth: int = MAX_DEPTH,
    what: str = "JSON",
    unique_keys: bool = False,
) -> Any:
    """Parses JSON from an untrusted source; raises :class:`UntrustedJsonError`, never crashes.

    ``what`` names the source in the error (e.g. "KMS release body"). ``unique_keys``: an
    object with a repeated key is an error (parsers disagree on which value wins, so a
    repeated key can mean one thing to one reader and another to the next).
    """
    raw = data.encode("utf-8", "surrogatepass") if isinstance(data, str) else bytes(data)
    if len(raw) > max_bytes:
        raise UntrustedJsonError(f"{what}: {len(raw)} bytes exceeds the limit of {max_bytes}")
    # bytes must be UTF-8 (text handed in is already decoded: its encoding is ours, and a lone
    # surrogate in it encodes to non-ASCII bytes, which the scan below reads correctly)
    text = data if isinstance(data, str) else require_utf8(raw, what)
    found = max_depth(raw)
    if found > depth:
        raise UntrustedJsonError(f"{what}: nesting depth {found} exceeds the limit of {depth}")
    _cap_recursion()  # belt and braces: a decoder bug past the scan still raises, not crashes
    try:
        return json.loads(text, object_pairs_hook=_unique_object if unique_keys else None,
                          parse_int=_parse_int)
    # JSONDecodeError and UnicodeDecodeError are ValueErrors.
    except (ValueError, RecursionError) as e:
        raise UntrustedJsonError(f"{what}: not valid JSON ({e})") from None
