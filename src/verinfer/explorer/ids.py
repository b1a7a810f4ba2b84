"""Strict parsing of the ids a reader types or a URL carries, once, at the boundary: a
malformed id is an InvalidRequestError (a 400 page), never a lookup."""

from __future__ import annotations

from verinfer.errors import InvalidRequestError
from verinfer.protocol.errors import ReceiptFormatError
from verinfer.protocol.hexutil import parse_hex
from verinfer.receipts.eip712 import parse_address as receipt_address


def parse_id32(text: str, what: str) -> bytes:
    return parse_hex(text, 32, what)


def parse_address(text: str) -> str:
    """0x + 40 hex -> the checksummed address; mixed case must be a valid EIP-55 checksum."""
    try:
        return receipt_address(text, "address")
    except ReceiptFormatError as e:
        raise InvalidRequestError(e.message, param="address") from e


def parse_int_id(text: str, what: str) -> int:
    if not (isinstance(text, str) and text.isascii() and text.isdigit() and len(text) <= 78):
        raise InvalidRequestError(f"{what} must be a decimal number, got {text[:80]!r}",
                                  param=what)
    return int(text)
