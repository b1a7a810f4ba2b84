"""The browsable lists: receipts, operators and models, each newest first, ``PAGE_SIZE`` a
page, with filters. Every filter is parsed strictly at the boundary (a malformed value is a
400 naming the parameter and what it takes; a model name no approved model has is a 404); a
page costs one pass over the list it filters (10,000 receipts: milliseconds), never a chain or
DA request.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from verinfer.chain.structs import ClaimStatus, Kind
from verinfer.errors import InvalidRequestError
from verinfer.explorer.errors import NotFoundError
from verinfer.explorer.ids import parse_address, parse_id32
from verinfer.explorer.index import Account, Index, ReceiptEntry
from verinfer.explorer.models import MAX_NAME, ModelNames
from verinfer.explorer.rows import _operator_state, hx, operator_row, when

#: Longest value a list filter takes (an address is 42, a model id 66, a name MAX_NAME).
MAX_FILTER = 2 * MAX_NAME
RECEIPT_STATUSES = ("challengeable", "final", "challenged", "slashed", "dismissed",
                    "inconclusive")
OPERATOR_STATES = ("active", "locked", "below-minimum")
MODEL_STATUSES = ("approved", "revoked", "unapproved")


def _bounded(value: str | None, param: str) -> str | None:
    if value is None or value == "":
        return None
    if len(value) > MAX_FILTER:
        raise InvalidRequestError(f"{param} of {len(value)} characters: at most {MAX_FILTER}",
                                  param=param)
    return value


def _choice(value: str | None, param: str, allowed: Sequence[str]) -> str | None:
    v = _bounded(value, param)
    if v is not None and v not in allowed:
        raise InvalidRequestError(f"{param} must be one of {', '.join(allowed)}; got "
                                  f"{v[:40]!r}", param=param)
    return v


# ---- model names ---------------------------------------------------------------------------
def model_label(names: ModelNames, mid: bytes) -> dict[str, str]:
    n = names.get(mid)
    return {"model_id": hx(mid), "model": n.name if n else "", "model_source": n.source if n
            else ""}


def find_models(idx: Index, names: ModelNames, text: str) -> list[bytes]:
    """Model ids (approved on chain or seen in a receipt) whose name is ``text`` (case
    insensitive), or else whose name contains it."""
    want = text.strip().lower()
    known = _model_ids(idx)
    table = names.snapshot()
    exact = [m for m in known if m in table and table[m].name.lower() == want]
    return exact or [m for m in known if m in table and want in table[m].name.lower()]


def parse_model(idx: Index, names: ModelNames, value: str | None) -> bytes | None:
    """A model filter: 0x + 64 hex, or a name one model has (404 if none does, 400 if several
    do: the list of them is /models?q=)."""
    v = _bounded(value, "model")
    if v is None:
        return None
    if v.lower().startswith("0x"):
        return parse_id32(v, "model")
    hits = find_models(idx, names, v)
    if not hits:
        raise NotFoundError(f"no model named {v[:MAX_NAME]!r} (model names come from the "
                            "deployment's model list and the operator endpoints)",
                            param="model")
    if len(hits) > 1:
        raise InvalidRequestError(f"{len(hits)} models match {v[:MAX_NAME]!r}: give the model "
                                  "id or the whole name", param="model")
    return hits[0]


def _model_ids(idx: Index) -> list[bytes]:
    """Approved model ids (in approval order), then ids only receipts name."""
    ids = [ap.item for ap in idx.approved_models()]
    return ids + [m for m in idx.receipts_by_model if m not in set(ids)]


# ---- receipts ------------------------------------------------------------------------------
def challengeable_until(idx: Index, e: ReceiptEntry) -> int | None:
    """Its batch's commit time + the challenge window (ChallengeManager._checkInclusion)."""
    window = idx.params.get("challenge_window")
    return None if window is None else idx.batches[e.batch_id].time + window


def receipt_status(idx: Index, digest: bytes, e: ReceiptEntry) -> str:
    chs = idx.challenges_by_receipt.get(digest)
    if chs:
        c = idx.challenges[chs[-1]]
        return "challenged" if not c.final else c.status.name.lower()
    if any(idx.claims[c].status is ClaimStatus.SLASHED
           for c in idx.claims_by_receipt.get(digest, ())):
        return "slashed"
    until = challengeable_until(idx, e)
    return "challengeable" if until is None or idx.head_time <= until else "final"


def receipt_list_row(idx: Index, names: ModelNames, digest: bytes) -> dict[str, Any]:
    e = idx.receipts[digest]
    r = e.signed.receipt
    until = challengeable_until(idx, e)
    return {"receipt": hx(digest), "operator": r.operator, **model_label(names, r.model_id),
            "issued_at": when(r.issued_at), "batch": hx(e.batch_id),
            "status": receipt_status(idx, digest, e),
            "challengeable_until": when(until) if until is not None else ""}


def receipts(idx: Index, names: ModelNames, page: int, operator: str | None,
             model: str | None, status: str | None, page_size: int) -> dict[str, Any]:
    op = parse_address(o) if (o := _bounded(operator, "operator")) else None
    st = _choice(status, "status", RECEIPT_STATUSES)
    mid = parse_model(idx, names, model)
    if op is not None and mid is not None:
        mine = idx.receipts_by_model.get(mid, [])
        pool: list[bytes] = [d for d in mine if idx.receipts[d].signed.receipt.operator == op]
    elif op is not None:
        pool = idx.receipts_by_operator.get(op, [])
    elif mid is not None:
        pool = idx.receipts_by_model.get(mid, [])
    else:
        pool = idx.receipt_order
    newest = reversed(pool)
    if st is not None:
        chosen = [d for d in newest if receipt_status(idx, d, idx.receipts[d]) == st]
    else:
        chosen = list(newest)
    rows, paging = page_of(chosen, page, page_size)
    return {"receipts": [receipt_list_row(idx, names, d) for d in rows], "paging": paging,
            "filters": {"operator": op or "", "model": hx(mid) if mid else "",
                        "model_name": (n.name if (n := names.get(mid)) else "") if mid
                        else "", "status": st or ""},
            "statuses": RECEIPT_STATUSES}


# ---- operators -----------------------------------------------------------------------------
def _state_key(state: str) -> str:
    return {"active": "active", "locked by disputes": "locked"}.get(state, "below-minimum")


def operators(idx: Index, names: ModelNames, page: int, operator: str | None,
              model: str | None, status: str | None, page_size: int) -> dict[str, Any]:
    op = parse_address(o) if (o := _bounded(operator, "operator")) else None
    st = _choice(status, "status", OPERATOR_STATES)
    mid = parse_model(idx, names, model)
    accts: list[Account] = idx.operators()
    if op is not None:
        accts = [a for a in accts if a.address == op]
    if mid is not None:
        serving = idx.operators_by_model.get(mid, set())
        accts = [a for a in accts if a.address in serving]
    if st is not None:
        accts = [a for a in accts if _state_key(_operator_state(idx, a)) == st]
    # most stake first
    accts.sort(key=lambda a: (-a.stake, a.address))
    rows, paging = page_of(accts, page, page_size)
    out = []
    for a in rows:
        served = sorted(m for m, ops in idx.operators_by_model.items() if a.address in ops)
        out.append({**operator_row(idx, a), "models": [model_label(names, m) for m in served]})
    return {"operators": out, "paging": paging,
            "filters": {"operator": op or "", "model": hx(mid) if mid else "",
                        "status": st or ""}, "statuses": OPERATOR_STATES}


# ---- models --------------------------------------------------------------------------------
def models(idx: Index, names: ModelNames, page: int, q: str | None, operator: str | None,
           status: str | None, page_size: int) -> dict[str, Any]:
    text = _bounded(q, "q")
    op = parse_address(o) if (o := _bounded(operator, "operator")) else None
    st = _choice(status, "status", MODEL_STATUSES)
    approvals = {ap.item: ap for ap in idx.approved_models()}
    ids = _model_ids(idx)
    if text is not None:
        ids = find_models(idx, names, text) if not text.lower().startswith("0x") \
            else [m for m in ids if m == parse_id32(text, "q")]
    if op is not None:
        ids = [m for m in ids if op in idx.operators_by_model.get(m, set())]
    challenged: dict[bytes, int] = {}
    for c in idx.challenges.values():
        e = idx.receipts.get(c.receipt_digest)
        if e is not None:
            m = e.signed.receipt.model_id
            challenged[m] = challenged.get(m, 0) + 1
    now = idx.head_time

    def state(m: bytes) -> str:
        ap = approvals.get(m)
        if ap is None:
            return "unapproved"
        return "revoked" if ap.until and ap.until <= now else "approved"

    if st is not None:
        ids = [m for m in ids if state(m) == st]
    rows, paging = page_of(list(reversed(ids)), page, page_size)
    out = []
    for m in rows:
        ap = approvals.get(m)
        out.append({**model_label(names, m), "status": state(m),
                    "approved_since": when(ap.since) if ap else "",
                    "revoked": when(ap.until) if ap and ap.until else "",
                    "receipts": len(idx.receipts_by_model.get(m, ())),
                    "operators": len(idx.operators_by_model.get(m, ())),
                    "challenges": challenged.get(m, 0)})
    return {"models": out, "paging": paging,
            "filters": {"q": text or "", "operator": op or "", "status": st or ""},
            "statuses": MODEL_STATUSES,
            "kinds": {"approved on chain": sum(1 for k in idx.approvals if k[0] is Kind.MODEL)}}


def page_of(items: Sequence[Any], page: int, page_size: int
            ) -> tuple[Sequence[Any], dict[str, int]]:
    pages = max(1, -(-len(items) // page_size))
    page = min(max(page, 1), pages)
    return items[(page - 1) * page_size: page * page_size], {"page": page, "pages": pages,
                                                              "total": len(items)}
