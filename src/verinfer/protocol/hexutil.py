"""``0x`` hex <-> bytes: the one parser every format, file and RPC answer goes through.

Strict on purpose: a value is ``0x`` followed by whole bytes of hex digits, of the expected
length when one is given. ``bytes.fromhex(x[2:])`` — which the code base used to repeat — drops
whatever the first two characters are and accepts spaces inside, so a malformed field could
decode instead of being refused, and the error (a bare ``ValueError``) named no field.
"""

from __future__ import annotations

import re

from verinfer.errors import InvalidRequestError

_HEX = re.compile(r"0x[0-9a-fA-F]*")


class HexFormatError(InvalidRequestError, ValueError):
    """A field is not ``0x``-prefixed hex of the expected length. Also a ``ValueError``, which
    the ``bytes.fromhex`` calls this replaces raised, so existing handlers keep catching it."""


def to_hex(data: bytes) -> str:
    return "0x" + data.hex()


def parse_hex(value: object, length: int | None = None, field: str = "value", *,
              lower_only: bool = False) -> bytes:
    """``0x``-prefixed hex -> bytes, exactly ``length`` bytes when given.

    ``lower_only`` rejects upper-case digits: canonical encodings accept one spelling only.
    """
    if not isinstance(value, str) or not _HEX.fullmatch(value) or len(value) % 2:
        raise HexFormatError(f"{field} must be 0x-prefixed hex of whole bytes, got {value!r:.100}",
                             param=field)
    if lower_only and value != value.lower():
        raise HexFormatError(f"{field} must be lower-case hex, got {value!r:.100}", param=field)
    raw = bytes.fromhex(value[2:])
    if length is not None and len(raw) != length:
        raise HexFormatError(
            f"{field} must be {length} bytes ({2 * length} hex digits), got {len(raw)}: "
            f"{value!r:.100}",
            param=field)
    return raw


def parse_hex_lenient(value: object, length: int | None = None, field: str = "value") -> bytes:
    """As :func:`parse_hex`, with the ``0x`` prefix optional: for values people type or that
    tools print either way (a private key in an environment variable, solc's bytecode)."""
    if isinstance(value, str) and value[:2] not in ("0x", "0X"):
        value = "0x" + value
    elif isinstance(value, str):
        value = "0x" + value[2:]
    return parse_hex(value, length, field)
