"""Page data: one function per page, reading the index (under its lock) and returning plain
JSON-able dicts. The HTML templates render exactly these dicts and ``/api/...`` returns them,
so a script sees what a person sees.

Ids from a path are parsed strictly, once (``ids``): a malformed one is a 400, a well-formed
one the index lacks a 404; the search box is ``search``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from verinfer.chain.structs import Kind, Role, Status
from verinfer.da_client.factory import DARouter
from verinfer.da_client.pointer import Pointer
from verinfer.errors import VerinferError
from verinfer.explorer import lists
from verinfer.explorer.charts import bar_chart, time_chart
from verinfer.explorer.errors import NotFoundError
from verinfer.explorer.ids import parse_address, parse_id32, parse_int_id
from verinfer.explorer.index import Challenge, Index
from verinfer.explorer.models import ModelNames
from verinfer.explorer.probes import AuditReportRow, Prober
from verinfer.explorer.rows import (
    PHASES,
    batch_row,
    challenge_row,
    claim_row,
    eth,
    hx,
    operator_row,
    phase,
    slash_row,
    verifier_rates,
    verifier_row,
    when,
)
from verinfer.explorer.search import search as search_index
from verinfer.receipts.eip712 import RECEIPT_FIELDS, Domain, recover_signer
from verinfer.receipts.merkle import verify_proof

PAGE_SIZE = 100
LATEST = 10
LIST_CAP = 200
#: A DA availability answer is reused this long: a page view must not become a DA request.
DA_CHECK_TTL_S = 5.0

K = TypeVar("K", bound=Hashable)
T = TypeVar("T")
R = TypeVar("R")


@dataclass(frozen=True)
class Context:
    """What the views need besides the index: the chain's identity, how to reach DA, and the
    options a reader passes to `verinfer challenge` against the same network."""

    index: Index
    domain: Domain
    prober: Prober | None
    da: DARouter | None
    rpc_url: str
    deployment_path: str
    da_args: tuple[str, ...] = ()
    names: ModelNames = field(default_factory=ModelNames)


def _status(ctx: Context) -> dict[str, Any]:
    idx = ctx.index
    version = idx.version + (ctx.prober.version if ctx.prober else 0)
    return {"head_block": idx.head_block, "indexed_block": idx.indexed_block,
            "follower_error": idx.follower_error,
            "head_time": when(idx.head_time), "version": version,
            "chain_id": ctx.domain.chain_id, "challenge_manager": ctx.domain.verifying_contract}


def status(ctx: Context) -> dict[str, Any]:
    with ctx.index.lock:
        return _status(ctx)


# ---- pages -----------------------------------------------------------------------------------
def overview(ctx: Context) -> dict[str, Any]:
    idx = ctx.index
    with idx.lock:
        batches = list(idx.batches.values())
        chs = list(idx.challenges.values())
        open_chs = [c for c in chs if not c.final]
        resolved = [c for c in chs if c.final]
        out = {
            "status": _status(ctx),
            "operators": [operator_row(idx, a) for a in idx.operators()],
            "verifiers": [verifier_row(idx, a) for a in idx.verifiers()],
            "totals": {"batches": len(batches), "receipts": sum(b.leaf_count for b in batches),
                       "challenges": len(chs), "open_challenges": len(open_chs),
                       "slashes": len(idx.slashes), "claims": len(idx.claims),
                       "slashed": eth(sum(s.amount for s in idx.slashes))},
            "latest_batches": _newest(batches, batch_row, LATEST),
            "open_challenges": _newest(open_chs, challenge_row, LATEST),
            "resolved_challenges": _newest(resolved, challenge_row, LATEST),
            "claims": _newest(list(idx.claims.values()), claim_row, LATEST),
            "slashes": _newest(idx.slashes, slash_row, LATEST),
            "audits": _audit_counts(ctx),
            "charts": _time_charts(idx, batches, chs),
            "endpoints": _endpoints(ctx),
            "params": _params(idx.params),
        }
    return out


def _params(p: dict[str, int]) -> list[dict[str, str]]:
    """The protocol parameters in force, wei as ETH, basis points as percent."""
    out = []
    for k, v in p.items():
        shown = eth(v) if k in ("challenge_bond", "slash_amount", "non_reveal_penalty",
                                "min_operator_stake", "min_verifier_stake") \
            else f"{v / 100:g} %" if k.endswith("_bps") else f"{v} s" if k.endswith(
                ("_period", "_window", "_deadline")) else str(v)
        out.append({"name": k.replace("_", " "), "value": shown})
    return out


def _time_charts(idx: Index, batches: list[Any], chs: list[Challenge]) -> dict[str, str]:
    """Receipts committed, throughput and challenges opened over the same span (the first
    batch or challenge to the chain's head), 24 buckets of a round width, with axes."""
    times = [b.time for b in batches] + [c.opened_at for c in chs]
    start = min(times, default=idx.head_time)
    end = max(idx.head_time, max(times, default=0))
    bt = [b.time for b in batches]
    leaves = [float(b.leaf_count) for b in batches]
    return {
        "receipts_over_time": time_chart(bt, "receipts committed over time", "receipts",
                                         start=start, end=end, weights=leaves),
        "throughput": time_chart(bt, "throughput: receipts committed per minute",
                                 "receipts / min", start=start, end=end, weights=leaves,
                                 rate_per_s=60.0),
        "challenges_over_time": time_chart(
            [c.opened_at for c in chs], "challenges opened over time (red: mostly slashed)",
            "challenges", start=start, end=end,
            red=[c.status is Status.SLASHED for c in chs]),
    }


def _audit_counts(ctx: Context) -> dict[str, Any]:
    idx = ctx.index
    out: dict[str, Any] = {"recorded": len(idx.audits),
                           "matches": sum(a.matches for a in idx.audits),
                           "mismatches": sum(not a.matches for a in idx.audits),
                           "stream": None}
    if ctx.prober is not None and ctx.prober.audits is not None:
        with ctx.prober.lock:
            a = ctx.prober.audits
            # a report counts only when signed by a verifier staked on this chain: anyone who
            # can write the stream can sign "mismatch" about an honest operator with a fresh
            # key, or copy an auditor's name under a signature that does not recover to it
            counted = [r for r in a.rows if _by_a_verifier(idx, r)]
            out["stream"] = {"reports": len(counted), "matches": sum(r.matches for r in counted),
                             "mismatches": sum(not r.matches for r in counted),
                             "unverified": len(a.rows) - len(counted), "dropped": a.dropped,
                             "malformed": a.malformed, "error": a.error}
    return out


def _by_a_verifier(idx: Index, r: AuditReportRow) -> bool:
    acct = idx.accounts.get(r.auditor)
    return r.signature_ok and acct is not None and acct.role is Role.VERIFIER


def _endpoints(ctx: Context) -> list[dict[str, Any]]:
    if ctx.prober is None:
        return []
    with ctx.prober.lock:
        return [{"url": e.url, "ok": e.ok, "models": e.models, "error": e.error}
                for e in ctx.prober.endpoints]


def _page(items: list[Any], page: int) -> tuple[list[Any], dict[str, int]]:
    rows, paging = lists.page_of(items, page, PAGE_SIZE)
    return list(rows), paging


def _newest(items: Sequence[T], row: Callable[[T], R], cap: int = LIST_CAP) -> list[R]:
    """The newest ``cap`` of ``items`` (held oldest first) as rows, newest first: a page shows
    the latest of a list, so its cost does not grow with the history behind it."""
    return [row(x) for x in reversed(items[-cap:])]


def _list_page(ctx: Context, key: str, items: Sequence[T], row: Callable[[T], R],
               page: int) -> dict[str, Any]:
    """A paged list page: ``items`` (held oldest first) newest first, ``PAGE_SIZE`` a page."""
    rows, paging = _page(list(reversed(items)), page)
    return {"status": _status(ctx), key: [row(x) for x in rows], "paging": paging}


def _found(table: Mapping[K, T], key: K, message: str, param: str) -> T:
    """``table[key]``; a well-formed id the index does not hold is a NotFoundError (404)."""
    value = table.get(key)
    if value is None:
        raise NotFoundError(message, param=param)
    return value


def operator(ctx: Context, address: str) -> dict[str, Any]:
    idx = ctx.index
    addr = parse_address(address)
    with idx.lock:
        a = _found(idx.accounts, addr, f"{addr} has no stake and opened no challenge",
                   "address")
        def by_challenge(c: int) -> dict[str, Any]:
            return challenge_row(idx.challenges[c])

        approvals = [{"kind": ap.kind.name.lower().replace("_", " "), "id": hx(ap.item),
                      "name": lists.model_label(ctx.names, ap.item)["model"]
                      if ap.kind is Kind.MODEL else "",
                      "since": when(ap.since), "revoked": when(ap.until)}
                     for ap in idx.approvals.values()]
        return {
            "status": _status(ctx),
            "account": {**operator_row(idx, a), "role": a.role.name.lower(),
                        "weight": eth(a.weight), "audits": a.audits},
            "stake_history": [{"block": p.block, "time": when(p.time), "stake": eth(p.stake),
                               "what": p.what} for p in reversed(a.history[-LIST_CAP:])],
            "stake_chart": bar_chart(
                [p.stake for p in a.history[-60:]],
                [f"block {p.block} ({when(p.time)}): {p.what}" for p in a.history[-60:]],
                "stake after each change (latest 60)", fmt=lambda v: eth(int(v)), y_label="stake",
                x_labels=[when(a.history[-60:][0].time), when(a.history[-1].time)]
                if a.history else None),
            "rates": verifier_rates(idx, a) if a.role is Role.VERIFIER else None,
            "approvals": approvals,
            "batches": _newest(a.batches, lambda b: batch_row(idx.batches[b]), 50),
            # the latest LIST_CAP of each list (the totals are in "account"; /challenges
            # pages through everything)
            "challenges": _newest(a.challenges, by_challenge),
            "claims": _newest(a.claims, lambda c: claim_row(idx.claims[c])),
            "committees": _newest(a.committees, by_challenge),
            "opened": _newest(a.opened, by_challenge),
            "list_cap": LIST_CAP,
            "slashes": [slash_row(s) for s in reversed(a.slashes)],
        }


def batch(ctx: Context, batch_id: str, page: int = 1) -> dict[str, Any]:
    idx = ctx.index
    bid = parse_id32(batch_id, "batch_id")
    with idx.lock:
        b = _found(idx.batches, bid, f"no committed batch {hx(bid)}", "batch_id")
        rows, paging = _page(b.receipts, page)
        deadline = idx.params.get("publication_deadline")
        receipts = []
        for d in rows:
            e = idx.receipts.get(d)
            receipts.append({"receipt": hx(d), "index": e.index if e else None,
                             "issued_at": when(e.signed.receipt.issued_at) if e else "",
                             "elsewhere": e is not None and e.batch_id != bid,
                             "indexed": e is not None})
        issued = [idx.receipts[d].signed.receipt.issued_at for d in b.receipts
                  if d in idx.receipts and idx.receipts[d].batch_id == bid]
        first_deadline = min(issued) + deadline if issued and deadline is not None else None
        return {"status": _status(ctx), "batch": {**batch_row(b),
                                                  "manifest_error": b.manifest_error},
                "publication_deadline": when(first_deadline) if first_deadline else "",
                # committed after the earliest receipt's deadline: that receipt could be
                # claimed unpublished (the contract compares with the commit time)
                "publication_met": first_deadline is None or b.time <= first_deadline,
                "publication_deadline_s": deadline, "receipts": receipts, "paging": paging}


_DA_SEEN: dict[str, tuple[float, str]] = {}  # pointer -> (when asked, answer)


def _da_available(ctx: Context, pointer: str) -> str:
    cache = _DA_SEEN
    if ctx.da is None:
        return "unknown (no DA backend configured)"
    hit = cache.get(pointer)
    if hit is not None and time.monotonic() - hit[0] < DA_CHECK_TTL_S:
        return hit[1]
    try:
        ans = "available" if ctx.da.exists(Pointer.parse(pointer)) else "missing"
    except VerinferError as e:
        ans = f"unknown ({e.message[:120]})"
    if len(cache) > 10_000:
        cache.clear()
    cache[pointer] = (time.monotonic(), ans)
    return ans


def receipt(ctx: Context, receipt_id: str) -> dict[str, Any]:
    idx = ctx.index
    digest = parse_id32(receipt_id, "receipt_id")
    with idx.lock:
        e = _found(idx.receipts, digest, f"no receipt {hx(digest)} in any committed batch",
                   "receipt_id")
        b = idx.batches[e.batch_id]
        proof = b.tree().proof(e.index)
        # what openChallenge checks: the proof leads to a root committed by this receipt's
        # own operator
        in_batch = b.operator == e.signed.receipt.operator and \
            verify_proof(digest, proof, b.root)
        chs = [challenge_row(idx.challenges[c]) for c in idx.challenges_by_receipt.get(digest,
                                                                                        [])]
        claims = [claim_row(idx.claims[c]) for c in idx.claims_by_receipt.get(digest, [])]
        audits = [{"auditor": a.auditor, "matches": a.matches,
                   "observed_out_hash": hx(a.observed_out_hash), "time": when(a.time)}
                  for a in (idx.audits[i] for i in idx.audits_by_receipt.get(digest, []))]
        signed, ciphertext = e.signed, e.ciphertext
        batch_of = batch_row(b)
        until = lists.challengeable_until(idx, e)
        state = lists.receipt_status(idx, digest, e)
        head_time = idx.head_time
    model = lists.model_label(ctx.names, signed.receipt.model_id)
    r = signed.receipt
    try:  # the signature, recovered here on the server (not taken from the manifest's word)
        signer = recover_signer(r, ctx.domain, signed.signature)
        sig_ok = signer == r.operator
        sig_note = "" if sig_ok else f"recovers to {signer}, not the operator {r.operator}"
    except VerinferError as err:
        signer, sig_ok, sig_note = "", False, err.message
    fields = []
    for name, typ, attr in RECEIPT_FIELDS:
        v = getattr(r, attr)
        fields.append({"name": name, "type": typ, "value": hx(v) if isinstance(v, bytes)
                       else str(v)})
    cmd = ["verinfer", "challenge", hx(digest), "--rpc-url", ctx.rpc_url, "--deployment",
           ctx.deployment_path, *ctx.da_args]
    # docs/cookbook.md §4: by receipt id, looked up in the chain's committed batches; the
    # model file (or shipped name) and the key epoch's secret are the auditor's to give
    reproduce = ["verinfer", "reproduce", hx(digest), "--model",
                 _shell_word(model["model"]) if model["model"] else "MODEL_FILE",
                 "--app-key", "APP_KEY_FILE", "--rpc-url", ctx.rpc_url, "--deployment",
                 ctx.deployment_path, *ctx.da_args]
    return {
        "status": _status(ctx),
        "receipt_id": hx(digest), "fields": fields, "issued_at": when(r.issued_at),
        "domain": ctx.domain.to_json(), "signature": hx(signed.signature),
        "signature_ok": sig_ok, "signer": signer, "signature_note": sig_note,
        "in_batch": in_batch, "batch": batch_of,
        "proof": {**proof.to_json(), "root": hx(b.root)},
        "ciphertext": ciphertext, "da_availability": _da_available(ctx, ciphertext),
        "challenges": chs, "claims": claims, "audits": audits,
        "challenge_command": " ".join(cmd),
        "reproduce_command": " ".join(reproduce),
        **model, "receipt_status": state,
        "challengeable_until": when(until) if until is not None else "",
        "challengeable_until_ts": until,
        "challengeable_now": until is not None and head_time <= until,
        "challenge_env": "VERINFER_CHAIN_PRIVATE_KEY (or --keystore FILE)",
    }


def challenge(ctx: Context, challenge_id: str) -> dict[str, Any]:
    idx = ctx.index
    cid = parse_int_id(challenge_id, "challenge_id")
    with idx.lock:
        c = _found(idx.challenges, cid, f"no challenge {cid}", "challenge_id")
        current = phase(c)
        commits = [v for v in c.votes.values() if v.committed_at]
        reveals = [v for v in c.votes.values() if v.revealed_at]
        members = len(c.votes)
        reached = PHASES.index(current)
        times = [c.opened_at, c.drawn_at, max((v.committed_at for v in commits), default=0),
                 max((v.revealed_at for v in reveals), default=0), c.resolved_at]
        notes = [f"by {c.challenger}, bond {eth(c.bond)}, draw at block {c.target_block}"
                 + (f" (re-armed {c.rearmed}x)" if c.rearmed else ""),
                 f"{members} members" if members else "waiting for the target block",
                 f"{len(commits)}/{members} committed" if members else "",
                 f"{len(reveals)}/{members} revealed" if members else "",
                 c.status.name.lower() if c.final else ""]
        timeline = [{"phase": p, "done": i <= reached, "current": i == reached,
                     "time": when(times[i]) if i <= reached else "", "note": notes[i]}
                    for i, p in enumerate(PHASES)]
        payouts = dict(idx.payouts(c))
        receipt_out = idx.receipts[c.receipt_digest].signed.receipt.out_hash \
            if c.receipt_digest in idx.receipts else None
        committee = [{"member": v.member, "weight": eth(v.weight),
                      "commitment": hx(v.commitment) if v.commitment else "",
                      "committed": when(v.committed_at),
                      "vote": hx(v.out_hash) if v.out_hash else "",
                      "agrees": (v.out_hash == receipt_out) if v.out_hash and receipt_out
                      else None,
                      "revealed": when(v.revealed_at), "penalty": eth(v.penalty),
                      "payout": eth(payouts.get(v.member, 0))} for v in c.votes.values()]
        others = {a: eth(w) for a, w in payouts.items() if a not in c.votes}
        return {"status": _status(ctx), "challenge": challenge_row(c), "phase": current,
                "timeline": timeline, "committee": committee,
                "commit_deadline": when(c.commit_deadline),
                "reveal_deadline": when(c.reveal_deadline),
                "receipt_out_hash": hx(receipt_out) if receipt_out else "",
                "majority_out_hash": hx(c.majority_out_hash) if c.final else "",
                "batch_id": hx(c.batch_id), "other_payouts": others,
                "slashed": eth(c.slashed), "final": c.final}


def claim(ctx: Context, claim_id: str) -> dict[str, Any]:
    idx = ctx.index
    cid = parse_int_id(claim_id, "claim_id")
    with idx.lock:
        c = _found(idx.claims, cid, f"no unpublished claim {cid}", "claim_id")
        return {"status": _status(ctx), "claim": claim_row(c),
                "answered_batch": hx(c.answered_batch) if c.answered_batch else "",
                "settled": when(c.settled_at)}


def audits(ctx: Context) -> dict[str, Any]:
    idx = ctx.index
    with idx.lock:
        recorded = [{"receipt": hx(a.receipt_digest), "auditor": a.auditor,
                     "matches": a.matches, "observed_out_hash": hx(a.observed_out_hash),
                     "report_hash": hx(a.report_hash), "time": when(a.time)}
                    for a in reversed(idx.audits[-200:])]
        counts = _audit_counts(ctx)
    stream: list[dict[str, Any]] = []
    if ctx.prober is not None and ctx.prober.audits is not None:
        with ctx.prober.lock:
            stream = [{"entry": r.entry_id, "job": r.job_id, "receipt": hx(r.receipt_digest),
                       "auditor": r.auditor, "matches": r.matches, "reason": r.reason,
                       "issued_at": when(r.issued_at), "signature_ok": r.signature_ok}
                      for r in reversed(ctx.prober.audits.rows[-200:])]
    return {"status": status(ctx), "counts": counts, "recorded": recorded, "stream": stream}


def kms(ctx: Context) -> dict[str, Any]:
    idx = ctx.index
    with idx.lock:
        epochs = [{"epoch": e.epoch, "threshold": e.threshold, "shards": e.shard_count,
                   "public_key": hx(e.public_key)[:42] + "…", "registered": when(e.registered_at),
                   "retired": when(e.retired_at)} for e in idx.epochs.values()]
        tees = [{"measurement": hx(ap.item), "since": when(ap.since), "revoked": when(ap.until)}
                for ap in idx.approvals.values() if ap.kind is Kind.ENCLAVE_MEASUREMENT]
        st = _status(ctx)
    shards: list[dict[str, Any]] = []
    if ctx.prober is not None:
        with ctx.prober.lock:
            shards = [{"url": s.url, "ok": s.ok, "index": s.index, "address": s.address,
                       "insecure_software_enclave": s.insecure_software_enclave,
                       "log_entries": s.log_count, "released": s.released,
                       "refused": s.refused, "error": s.error} for s in ctx.prober.shards]
    return {"status": st, "epochs": epochs, "accepted_tees": tees, "shards": shards}


def challenges_list(ctx: Context, page: int = 1) -> dict[str, Any]:
    with ctx.index.lock:
        return _list_page(ctx, "challenges", list(ctx.index.challenges.values()),
                          challenge_row, page)


def batches_list(ctx: Context, page: int = 1) -> dict[str, Any]:
    with ctx.index.lock:
        return _list_page(ctx, "batches", list(ctx.index.batches.values()), batch_row, page)


def receipts_list(ctx: Context, page: int = 1, operator: str | None = None,
                  model: str | None = None, status: str | None = None) -> dict[str, Any]:
    with ctx.index.lock:
        return {"status": _status(ctx), **lists.receipts(ctx.index, ctx.names, page, operator,
                                                         model, status, PAGE_SIZE)}


def operators_list(ctx: Context, page: int = 1, operator: str | None = None,
                   model: str | None = None, status: str | None = None) -> dict[str, Any]:
    with ctx.index.lock:
        return {"status": _status(ctx), **lists.operators(ctx.index, ctx.names, page, operator,
                                                          model, status, PAGE_SIZE)}


def models_list(ctx: Context, page: int = 1, q: str | None = None,
                operator: str | None = None, status: str | None = None) -> dict[str, Any]:
    with ctx.index.lock:
        return {"status": _status(ctx), **lists.models(ctx.index, ctx.names, page, q, operator,
                                                       status, PAGE_SIZE)}


def search(ctx: Context, query: str) -> dict[str, Any]:
    """The page a search query names (``search.search`` over this explorer's index)."""
    return search_index(ctx.index, query, ctx.names)


def _shell_word(text: str) -> str:
    import shlex

    return shlex.quote(text)
