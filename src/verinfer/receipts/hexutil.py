"""Strict 0x-hex parsing shared by every receipts structure."""

from __future__ import annotations

import re

from verinfer.receipts.errors import ReceiptFormatError

_HEX = re.compile(r"0x[0-9a-fA-F]*")


def to_hex(data: bytes) -> str:
    return "0x" + data.hex()


def parse_hex(value: object, length: int | None, field: str, *, lower_only: bool = False) -> bytes:
    """``0x``-prefixed hex -> bytes, exactly ``length`` bytes when given.

    ``lower_only`` rejects upper-case digits: canonical encodings accept one spelling only.
    """
    if not isinstance(value, str) or not _HEX.fullmatch(value) or len(value) % 2:
        raise ReceiptFormatError(f"{field} must be 0x-prefixed hex of whole bytes, got {value!r}",
                                 param=field)
    if lower_only and value != value.lower():
        raise ReceiptFormatError(f"{field} must be lower-case hex, got {value!r}", param=field)
    raw = bytes.fromhex(value[2:])
    if length is not None and len(raw) != length:
        raise ReceiptFormatError(
            f"{field} must be {length} bytes ({2 * length} hex digits), got {len(raw)}: {value!r}",
            param=field)
    return raw


def check_bytes(value: object, length: int, field: str) -> bytes:
    if not isinstance(value, bytes) or len(value) != length:
        raise ReceiptFormatError(f"{field} must be {length} bytes, got {value!r}", param=field)
    return value


def check_uint(value: object, bits: int, field: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < (1 << bits):
        raise ReceiptFormatError(f"{field} must be an integer in [0, 2^{bits}), got {value!r}",
                                 param=field)
    return value
