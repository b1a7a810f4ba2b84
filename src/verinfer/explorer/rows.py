"""One row per record, as the tables of several pages show it (plain JSON-able dicts), and
the formatting of wei, times and hashes."""

from __future__ import annotations

import datetime as dt
from typing import Any

from verinfer.chain.structs import ETHER, ClaimStatus, Role
from verinfer.explorer.index import FAULTS, Account, Batch, Challenge, Claim, Index, Slash
from verinfer.protocol.hexutil import to_hex

#: A challenge's phases, in order (the timeline on its page).
PHASES = ("opened", "drawn", "commits", "reveals", "verdict")


def hx(b: bytes) -> str:
    return to_hex(b)


def eth(wei: int) -> str:
    s = f"{wei / ETHER:.6f}".rstrip("0").rstrip(".")
    return f"{s} ETH"


def when(ts: int) -> str:
    """A chain or receipt time as UTC text. Some are the operator's word (a receipt's signed
    issuedAt is any uint64): one past year 9999 is shown as the number it is."""
    if not ts:
        return ""
    try:
        return dt.datetime.fromtimestamp(ts, dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    except (OverflowError, ValueError, OSError):
        return f"{ts} (not a date)"


def operator_minimum(idx: Index) -> int:
    """The operator minimum in force: the StakeRegistry's (a raise waits for its notice), the
    configured one before the registry said."""
    if idx.min_operator_stake_in_force is not None:
        return idx.min_operator_stake_in_force
    return idx.params.get("min_operator_stake", ETHER)


def _operator_state(idx: Index, a: Account) -> str:
    minimum = operator_minimum(idx)
    if a.stake - a.locked < minimum and a.stake >= minimum:
        return "locked by disputes"
    return "active" if a.stake >= minimum else "below minimum stake"


def _pending_shortfall(idx: Index, a: Account) -> dict[str, Any]:
    """A raise of the operator minimum this account does not meet yet: by when it must bond."""
    pending = idx.pending_minimums.get(Role.OPERATOR)
    if pending is None or a.stake >= pending[0]:
        return {}
    return {"pending_minimum": eth(pending[0]), "pending_minimum_from": when(pending[1])}


def operator_row(idx: Index, a: Account) -> dict[str, Any]:
    chs = [idx.challenges[c] for c in a.challenges]
    return {"address": a.address, "stake": eth(a.stake), "stake_wei": str(a.stake),
            "locked": eth(a.locked), "unbonding": eth(a.unbonding),
            "state": _operator_state(idx, a), **_pending_shortfall(idx, a),
            "batches": len(a.batches),
            "receipts": sum(idx.batches[b].leaf_count for b in a.batches),
            "open_challenges": sum(not c.final for c in chs),
            "resolved_challenges": sum(c.final for c in chs), "slashes": len(a.slashes),
            "slashed": eth(sum(s.amount for s in a.slashes))}


def _rate(done: int, due: int) -> str:
    return f"{done}/{due} ({100 * done / due:.0f} %)" if due else "—"


def verifier_rates(idx: Index, a: Account) -> dict[str, Any]:
    """Liveness: of the committee seats whose commit phase is over (or committed), the share
    it committed in; reveal rate: of the seats whose reveal phase is over (or revealed), the
    share it revealed in. A seat still inside its phase counts for neither yet."""
    now = idx.head_time
    commit_due = committed = reveal_due = revealed = 0
    for cid in dict.fromkeys(a.committees):
        c = idx.challenges.get(cid)
        v = c.votes.get(a.address) if c is not None else None
        if c is None or v is None:
            continue
        if v.committed_at or c.final or now > c.commit_deadline:
            commit_due += 1
            committed += bool(v.committed_at)
        if v.revealed_at or c.final or now > c.reveal_deadline:
            reveal_due += 1
            revealed += bool(v.revealed_at)
    return {"liveness": _rate(committed, commit_due), "reveal_rate": _rate(revealed, reveal_due),
            "commits": committed, "commit_due": commit_due, "reveals": revealed,
            "reveal_due": reveal_due}


def verifier_row(idx: Index, a: Account) -> dict[str, Any]:
    return {"address": a.address, "stake": eth(a.stake), "weight": eth(a.weight),
            "committees": len(a.committees), "audits": a.audits, **verifier_rates(idx, a)}


def batch_row(b: Batch) -> dict[str, Any]:
    return {"batch_id": hx(b.batch_id), "operator": b.operator, "root": hx(b.root),
            "leaf_count": b.leaf_count, "da_pointer": b.da_pointer, "block": b.block,
            "time": when(b.time), "manifest": b.manifest}


def phase(c: Challenge) -> str:
    if c.final:
        return "verdict"
    if not c.votes:
        return "opened"
    commits = sum(1 for v in c.votes.values() if v.committed_at)
    reveals = sum(1 for v in c.votes.values() if v.revealed_at)
    if reveals or commits == len(c.votes):
        return "reveals"
    return "commits" if commits else "drawn"


def challenge_row(c: Challenge) -> dict[str, Any]:
    return {"id": c.id, "receipt": hx(c.receipt_digest), "operator": c.operator,
            "challenger": c.challenger, "status": c.status.name.lower(), "phase": phase(c),
            "bond": eth(c.bond), "opened": when(c.opened_at), "resolved": when(c.resolved_at),
            "slashed": eth(c.slashed)}


def claim_row(c: Claim) -> dict[str, Any]:
    status = {ClaimStatus.OPEN: "open", ClaimStatus.ANSWERED: "answered",
              ClaimStatus.SLASHED: "upheld"}.get(c.status, c.status.name.lower())
    return {"id": c.id, "receipt": hx(c.receipt_digest), "operator": c.operator,
            "claimant": c.claimant, "status": status, "publish_by": when(c.publish_by),
            "response_deadline": when(c.response_deadline), "opened": when(c.opened_at),
            "slashed": eth(c.slashed)}


def slash_row(s: Slash) -> dict[str, Any]:
    kind = "claim" if s.fault == FAULTS[2] else "challenge"
    return {"operator": s.operator, "receipt": hx(s.receipt_digest), "fault": s.fault,
            "amount": eth(s.amount), "dispute": s.dispute_id, "dispute_kind": kind,
            "time": when(s.time), "block": s.block}
