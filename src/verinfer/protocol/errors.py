"""Typed errors of the canonical formats (ExecRequest and the structures built on it).

They live in the protocol layer because the ExecRequest does (both sides of a dispute decode it
identically); :mod:`verinfer.receipts.errors` re-exports them under the same names, so
``except ReceiptFormatError`` catches the same class wherever it is imported from.
"""

from __future__ import annotations

from verinfer.errors import BadInputError

__all__ = ["NonCanonicalEncodingError", "ReceiptFormatError", "UnsupportedVersionError"]


class ReceiptFormatError(BadInputError):
    """A receipt, encoding or proof field is malformed (bad hex, wrong length, bad type/range)."""

    code = "receipt_format_error"


class NonCanonicalEncodingError(ReceiptFormatError):
    """Bytes decode, but re-encoding them does not give the same bytes."""

    code = "non_canonical_encoding"


class UnsupportedVersionError(ReceiptFormatError):
    """A structure names a version this implementation does not know."""

    code = "unsupported_version"
