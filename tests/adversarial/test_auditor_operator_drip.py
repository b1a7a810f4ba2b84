"""A cheating operator drips its ``/v1/receipts/{id}`` answer to stall an auditor.

``verinfer reproduce 0x<receipt id> --operator-url URL`` asks the operator for the receipt. The
answer was bounded in size (4 MiB) but not in time: httpx's 30 s timeout is per read, so an
operator sending a byte every few seconds held the auditor — a watcher about to check, and
challenge, that operator's receipt — for days. Who gains: the operator whose receipt is being
audited. Fix: a whole-answer deadline (``verinfer.auditor.sources.OPERATOR_DEADLINE_S``), then a
typed ReceiptRefError naming the URL.
"""

from __future__ import annotations

import pytest

from support.drip import dripping_server, outcome_within
from verinfer.auditor import sources
from verinfer.verifier.errors import ReceiptRefError


def test_a_dripping_operator_answer_ends_at_the_deadline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sources, "OPERATOR_DEADLINE_S", 1.0, raising=False)
    with dripping_server() as url:
        err, took = outcome_within(
            lambda: sources.resolve_ref("0x" + "11" * 32, domain=None, operator_url=url))
    assert isinstance(err, ReceiptRefError) and "within" in str(err), err
    assert took < 5
