"""What a client runs on a response's ``verification`` object (docs/operator.md, "How a client
checks an answer"): one function, so every client applies the same rules.

:func:`check_verification` refuses, with a typed error, a verification object whose

* signature does not recover to the receipt's operator (or the operator the client expects),
* receipt chainId differs from the EIP-712 domain's or from the chain the client uses (such a
  receipt verifies off chain but can never be challenged on chain),
* ``issuedAt`` lies outside ``max_skew_s`` of the client's clock, either way: a future
  issuedAt starts the publication and challenge windows late (2^64 - 1: never), a past one
  may already have left them — a fresh answer carries a fresh receipt,
* ``req_hash``/``out_hash`` do not recompute from the ``exec_request``/``exec_result`` given,
  or differ from the receipt's ``reqHash``/``outHash``.

Checking what the client asked for (prompt ids, seed, decode policy) and the Merkle inclusion
later remain the client's steps 3 and 4.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

from verinfer.receipts.canonical import ExecRequest, ExecResult
from verinfer.receipts.eip712 import (
    MAX_ISSUED_AT_SKEW_S,
    Domain,
    Receipt,
    check_issued_at,
    check_receipt_domain,
    verify_receipt,
)
from verinfer.receipts.errors import IssuedAtSkewError, ReceiptFormatError
from verinfer.receipts.hexutil import parse_hex


def check_verification(v: Mapping[str, Any], *, chain_id: int,
                       operator: str | None = None,
                       now: Callable[[], float] = time.time,
                       max_skew_s: int = MAX_ISSUED_AT_SKEW_S) -> Receipt:
    """Checks one ``verification`` entry (choice); returns its receipt. Raises
    :class:`~verinfer.receipts.errors.SignatureError` (``WrongChainError`` for the chain
    rule), :class:`~verinfer.receipts.errors.IssuedAtSkewError` or ``ReceiptFormatError``."""
    try:
        typed, signature = v["receipt"], parse_hex(v["signature"], 65, "signature")
        domain = Domain.from_json(typed["domain"])
        receipt = Receipt.from_json(typed["message"])
    except (KeyError, TypeError) as e:
        raise ReceiptFormatError(f"verification object lacks {e}") from None
    check_receipt_domain(receipt, domain, chain_id)
    verify_receipt(receipt, domain, signature, operator, chain_id=chain_id)
    t = now()
    check_issued_at(receipt.issued_at, t, skew_s=max_skew_s)
    if receipt.issued_at < int(t) - max_skew_s:
        raise IssuedAtSkewError(f"receipt issuedAt {receipt.issued_at} is more than "
                                f"{max_skew_s} s before now ({int(t)})", param="issuedAt")
    try:
        req = ExecRequest.from_json(v["exec_request"])
        res = ExecResult.from_json(v["exec_result"])
        claimed = (parse_hex(v["req_hash"], 32, "req_hash"),
                   parse_hex(v["out_hash"], 32, "out_hash"))
    except (KeyError, TypeError) as e:
        raise ReceiptFormatError(f"verification object lacks {e}") from None
    if (req.hash, res.hash) != claimed or claimed != (receipt.req_hash, receipt.out_hash):
        raise ReceiptFormatError("req_hash/out_hash do not match exec_request/exec_result "
                                 "or the receipt's reqHash/outHash")
    return receipt
