"""Field checks of the canonical formats: hex, fixed-length bytes, unsigned integers.

Hex parsing has one home, :mod:`verinfer.protocol.hexutil`; these re-raise its errors as
:class:`ReceiptFormatError`, the error every canonical structure raises for a bad field.
The receipts structures import them from here (their one home).
"""

from __future__ import annotations

from verinfer.protocol import hexutil as _hex
from verinfer.protocol.errors import ReceiptFormatError

__all__ = ["check_bytes", "check_uint", "parse_hex", "show"]


def show(value: object, limit: int = 100) -> str:
    """``repr(value)`` cut to ``limit`` characters, for error messages about values another
    party sent: a decoded CBOR bignum too long for ``repr`` (sys.get_int_max_str_digits) would
    otherwise turn a typed format error into a bare ValueError."""
    try:
        text = repr(value)
    except ValueError:
        text = f"<an integer of {value.bit_length()} bits>" if isinstance(value, int) else "?"
    return text[:limit]


def parse_hex(value: object, length: int | None, field: str, *, lower_only: bool = False) -> bytes:
    """``0x``-prefixed hex -> bytes (:func:`verinfer.protocol.hexutil.parse_hex`)."""
    try:
        return _hex.parse_hex(value, length, field, lower_only=lower_only)
    except _hex.HexFormatError as e:
        raise ReceiptFormatError(e.message, param=field) from None


def check_bytes(value: object, length: int, field: str) -> bytes:
    if not isinstance(value, bytes) or len(value) != length:
        raise ReceiptFormatError(f"{field} must be {length} bytes, got {show(value)}", param=field)
    return value


def check_uint(value: object, bits: int, field: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < (1 << bits):
        raise ReceiptFormatError(f"{field} must be an integer in [0, 2^{bits}), got {show(value)}",
                                 param=field)
    return value
