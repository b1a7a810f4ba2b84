"""Client side of committed logprobs: does what the API returned equal what the receipt commits?

The receipt's ``outHash`` commits ``ExecResult.logprobs`` (docs/receipts.md §1), and the
committee re-executes exactly those values. What the client *reads*, though, is the OpenAI
``logprobs`` object next to it — an operator could show other numbers there than it committed
(a better-looking confidence, say) and stay un-slashable, because the committee only judges the
commitment. So a client compares the two, value by value and bit for bit (JSON numbers
round-trip float64 exactly); this module is that comparison, for both endpoint shapes.

Call it after ``check_verification`` (receipts/client_check.py) has tied ``exec_result`` to
the signed ``outHash``. For a stream, pass the per-token entries of every chunk, concatenated.
Token strings/bytes are not checked here (that needs the tokenizer): the numbers and their
order are.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping, Sequence
from typing import Any

from verinfer.protocol.errors import ReceiptFormatError
from verinfer.receipts.canonical import ExecResult


class LogprobsMismatchError(ReceiptFormatError):
    """The logprobs a response shows differ from the ones its receipt commits."""

    code = "logprobs_mismatch"


def _bits(x: object) -> int | None:
    if type(x) is int:  # a JSON writer may print -3.0 as -3
        x = float(x)
    if type(x) is not float:
        return None
    return int.from_bytes(struct.pack(">d", x), "big")


def _committed(result: ExecResult, shown: int) -> tuple[tuple[float, tuple[float, ...]], ...]:
    if result.logprobs is None:
        raise LogprobsMismatchError("the response shows logprobs but the receipt commits none",
                                    param="logprobs")
    if shown != len(result.logprobs):
        raise LogprobsMismatchError(f"the response shows logprobs for {shown} tokens, the "
                                    f"receipt commits {len(result.logprobs)}", param="logprobs")
    return tuple((lp, tuple(v for _, v in top)) for lp, top in result.logprobs)


def _same(i: int, what: str, shown: object, committed: float) -> None:
    if _bits(shown) != _bits(committed):
        raise LogprobsMismatchError(f"token {i}: {what} shown as {shown!r}, committed "
                                    f"{committed!r}", param="logprobs")


def check_chat_logprobs(content: Sequence[Mapping[str, Any]] | None,
                        result: ExecResult) -> None:
    """``choices[i].logprobs.content`` of a chat response (None: no logprobs shown) against
    ``result``. Raises :class:`LogprobsMismatchError`."""
    if content is None:
        if result.logprobs is not None:
            raise LogprobsMismatchError("the receipt commits logprobs the response does not "
                                        "show", param="logprobs")
        return
    for i, (entry, (lp, alts)) in enumerate(zip(content, _committed(result, len(content)),
                                                strict=True)):
        _same(i, "logprob", entry.get("logprob"), lp)
        top = entry.get("top_logprobs") or []
        if len(top) != len(alts):
            raise LogprobsMismatchError(f"token {i}: {len(top)} alternatives shown, "
                                        f"{len(alts)} committed", param="logprobs")
        for j, (t, v) in enumerate(zip(top, alts, strict=True)):
            _same(i, f"alternative {j}", t.get("logprob") if isinstance(t, Mapping) else t, v)


def check_completion_logprobs(logprobs: Mapping[str, Any] | None, result: ExecResult) -> None:
    """``choices[i].logprobs`` of a legacy completion (``token_logprobs``, ``top_logprobs``)
    against ``result``. The legacy shape keys alternatives by token *text*, so two ids that
    decode alike collapse into one entry (the later value under the earlier key): without the
    tokenizer the check is that every value shown is a committed one (as a multiset) and no
    more are shown than committed. The chosen tokens' values are checked exactly."""
    if logprobs is None:
        if result.logprobs is not None:
            raise LogprobsMismatchError("the receipt commits logprobs the response does not "
                                        "show", param="logprobs")
        return
    tokens = list(logprobs.get("token_logprobs") or [])
    tops = list(logprobs.get("top_logprobs") or [])
    committed = _committed(result, len(tokens))
    if len(tops) != len(tokens):
        raise LogprobsMismatchError("token_logprobs and top_logprobs differ in length",
                                    param="logprobs")
    for i, (shown, top, (lp, alts)) in enumerate(zip(tokens, tops, committed, strict=True)):
        _same(i, "logprob", shown, lp)
        values = list(top.values()) if isinstance(top, Mapping) else None
        if values is None or len(values) > len(alts):
            raise LogprobsMismatchError(f"token {i}: alternatives shown are not a subset of "
                                        "the committed ones", param="logprobs")
        pool = [_bits(v) for v in alts]
        for j, v in enumerate(values):
            b = _bits(v)
            if b not in pool:
                raise LogprobsMismatchError(f"token {i}: alternative {j} shown as {v!r} is "
                                            "not a committed value", param="logprobs")
            pool.remove(b)
