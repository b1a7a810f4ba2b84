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

from verinfer.protocol.errors import ReceiptFormatError
from verinfer.protocol.exec_request import ExecRequest
from verinfer.protocol.fields import parse_hex
from verinfer.protocol.hexutil import to_hex
from verinfer.receipts.canonical import ExecResult
from verinfer.receipts.eip712 import (
    MAX_ISSUED_AT_SKEW_S,
    Domain,
    Receipt,
    check_issued_at,
    check_receipt_domain,
    verify_receipt,
)
from verinfer.receipts.errors import IssuedAtSkewError


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


class DuplicateChoiceError(ReceiptFormatError):
    """Two choices of one response carry the same ExecRequest (or a choice is not the one its
    position names): the client asked for independent samples and got copies."""

    code = "duplicate_choice"


def check_choices(v: Mapping[str, Any], *, chain_id: int, choices: int,
                  choices_per_prompt: int | None = None, operator: str | None = None,
                  now: Callable[[], float] = time.time,
                  max_skew_s: int = MAX_ISSUED_AT_SKEW_S) -> list[Receipt]:
    """Checks a whole response's ``verification`` object: ``choices`` entries (prompts x n;
    the top level alone when 1), each by :func:`check_verification`, and no two with the same
    ``req_hash``.

    Why: a receipt does not name its choice index, and each ExecRequest of the request rule
    is conformant on its own, so an operator could run choice 0 once and sign it again as
    choice 1 (saving the compute of n - 1 samples). Distinct req_hashes, each of them one of
    the rule's requests (which a challenge checks), means the n receipts are the rule's n
    requests in some order: n independent samples. With ``choices_per_prompt`` (the body's
    ``n``) the order is checked too: response choice ``p*n + i`` carries
    ``choice_seed(seed of choice p*n, i)`` — checkable without the tokenizer."""
    from verinfer.protocol.request_rule import choice_seed

    listed = v.get("choices")
    entries: list[Any] = listed if isinstance(listed, list) else [v]
    if len(entries) != choices:
        raise ReceiptFormatError(f"the response verifies {len(entries)} choices, the request "
                                 f"asked for {choices}")
    if choices > 1 and (not isinstance(entries[0], Mapping)
                        or entries[0].get("receipt_id") != v.get("receipt_id")):
        raise ReceiptFormatError("the top-level verification is not choice 0's")
    receipts = [check_verification(e, chain_id=chain_id, operator=operator, now=now,
                                   max_skew_s=max_skew_s) for e in entries]
    seen: dict[bytes, int] = {}
    for k, r in enumerate(receipts):
        if r.req_hash in seen:
            raise DuplicateChoiceError(f"choices {seen[r.req_hash]} and {k} carry the same "
                                       f"ExecRequest (reqHash {to_hex(r.req_hash)})",
                                       param="choices")
        seen[r.req_hash] = k
    if choices_per_prompt is not None and choices_per_prompt > 1:
        seeds = [ExecRequest.from_json(e["exec_request"]).seed for e in entries]
        for k, s in enumerate(seeds):
            p, i = divmod(k, choices_per_prompt)
            if s != choice_seed(seeds[p * choices_per_prompt], i):
                raise DuplicateChoiceError(f"choice {k} carries seed {s}, not choice {i} of "
                                           f"prompt {p}'s seed", param="choices")
    return receipts
