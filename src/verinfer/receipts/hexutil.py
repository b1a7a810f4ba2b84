"""Hex and integer field checks for the receipts structures: those of the protocol layer
(:mod:`verinfer.protocol.fields`, where the ExecRequest uses them), re-exported here."""

from __future__ import annotations

from verinfer.protocol.fields import check_bytes, check_uint, parse_hex, to_hex

__all__ = ["check_bytes", "check_uint", "parse_hex", "to_hex"]
