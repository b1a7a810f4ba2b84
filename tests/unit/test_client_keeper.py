"""The receipt keeper's state machine and store, with a fake of time only: real signed
receipts, a real SQLite file, and the chain's and DA's answers as the plain values the keeper
decides on (``Observation``) — nothing stands in for the chain or DA here (the devnet e2e test
runs them: the keeper tests at the end of tests/e2e/test_client_verified.py)."""

from __future__ import annotations

import hashlib
import sqlite3
import threading
from dataclasses import replace
from pathlib import Path

import pytest

from verinfer.chain.errors import RpcDeadlineError
from verinfer.chain.rpc import call_within
from verinfer.chain.structs import ClaimStatus
from verinfer.client.keeper import (
    DA,
    KeeperConfigError,
    KeeperPolicy,
    Observation,
    Terms,
    decide,
    status_of,
)
from verinfer.client.receipt_store import (
    SCHEMA_VERSION,
    Kept,
    Leaf,
    ReceiptStore,
    State,
    StoreConflictError,
    StoreError,
    UnknownReceiptError,
)
from verinfer.protocol.hexutil import to_hex
from verinfer.receipts.eip712 import Domain, Receipt, ReceiptSigner
from verinfer.receipts.signed import SignedReceipt

T0 = 1_800_000_000  # issuedAt of the receipts (chain time, seconds)
TERMS = Terms(publication_deadline=600, challenge_window=3600, claim_window=3600,
              da_grace_s=300)
PUBLISH_BY = T0 + 600
DOMAIN = Domain(31337, "0x" + "11" * 20)
SIGNER = ReceiptSigner(hashlib.sha256(b"keeper unit operator").digest())


class FakeClock:
    """The one fake: wall time that moves only when told."""

    def __init__(self, t: float = 1000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t

    def advance(self, s: float) -> None:
        self.t += s


def signed(n: int = 0, issued_at: int = T0) -> SignedReceipt:
    h = [hashlib.sha256(f"{n}:{k}".encode()).digest() for k in range(5)]
    r = Receipt(operator=SIGNER.address, chain_id=31337, model_id=h[0],
                engine_fingerprint_hash=h[1], req_hash=h[2], out_hash=h[3], key_epoch=1,
                ciphertext_hash=h[4], issued_at=issued_at)
    return SignedReceipt.sign(r, DOMAIN, SIGNER)


def kept(state: State = State.PENDING, **kw: object) -> Kept:
    s = signed()
    return replace(Kept(to_hex(s.digest), s, State.PENDING), state=state, **kw)  # type: ignore[arg-type]


def leaf(committed_at: int) -> Leaf:
    return Leaf("0x" + "aa" * 32, SIGNER.address, "0x" + "bb" * 32, 3, ("0x" + "cc" * 32,),
                "da://local/0x" + "dd" * 32, committed_at)


# ---- the happy path ------------------------------------------------------------------------------
def test_an_honest_receipt_goes_pending_batched_available_final() -> None:
    k = kept()
    d = decide(k, T0 + 5, TERMS, Observation(), can_claim=True)
    assert (d.action, d.kept.state, d.kept.deadline) == ("wait", State.PENDING, PUBLISH_BY)
    d = decide(k, T0 + 10, TERMS, Observation(found=leaf(T0 + 8)), can_claim=True)
    assert (d.action, d.kept.state) == ("move", State.BATCHED)
    b = d.kept
    assert (b.batch_root, b.leaf_index, b.committed_at) == ("0x" + "bb" * 32, 3, T0 + 8)
    assert b.deadline == PUBLISH_BY + TERMS.da_grace_s  # availability deadline
    d = decide(b, T0 + 20, TERMS, Observation(da=DA.AVAILABLE), can_claim=True)
    assert (d.action, d.kept.state) == ("move", State.AVAILABLE)
    a = d.kept
    assert a.final_after == T0 + 8 + 3600 and a.deadline == a.final_after
    # the window is still open at its last second
    assert decide(a, a.final_after, TERMS, Observation(), can_claim=True).action == "wait"
    d = decide(a, a.final_after + 1, TERMS, Observation(), can_claim=True)
    assert (d.action, d.kept.state, d.kept.deadline) == ("move", State.FINAL, None)
    # nothing moves a final receipt
    assert decide(d.kept, a.final_after + 10**6, TERMS, Observation(da=DA.ABSENT),
                  can_claim=True).action == "wait"


# ---- no answer decides nothing -------------------------------------------------------------------
def test_a_failed_da_read_never_marks_a_receipt_unavailable() -> None:
    b = decide(kept(), T0 + 10, TERMS, Observation(found=leaf(T0 + 8)), can_claim=True).kept
    late = PUBLISH_BY + TERMS.da_grace_s + 10**6
    for obs in (Observation(), Observation(da=DA.UNKNOWN)):
        d = decide(b, late, TERMS, obs, can_claim=True)
        assert (d.action, d.kept.state) == ("wait", State.BATCHED)
    # a definite "not there" counts only after the grace
    assert decide(b, PUBLISH_BY + TERMS.da_grace_s, TERMS, Observation(da=DA.ABSENT),
                  can_claim=True).action == "wait"
    d = decide(b, PUBLISH_BY + TERMS.da_grace_s + 1, TERMS, Observation(da=DA.ABSENT),
               can_claim=True)
    assert d.kept.state is State.UNAVAILABLE and "full challenge" in (d.kept.note or "")


def test_an_unread_claim_status_never_settles_a_claim() -> None:
    c = kept(State.CLAIMED, claim_id=7, deadline=PUBLISH_BY + 900)
    d = decide(c, PUBLISH_BY + 10**6, TERMS, Observation(), can_claim=True)
    assert (d.action, d.kept.state) == ("wait", State.CLAIMED)


def test_an_available_receipt_is_final_only_by_the_window_not_by_silence() -> None:
    a = kept(State.AVAILABLE, committed_at=T0 + 8, final_after=T0 + 8 + 3600)
    assert decide(a, T0 + 3000, TERMS, Observation(), can_claim=True).action == "wait"


# ---- the missed deadline -------------------------------------------------------------------------
def test_a_missed_deadline_files_the_claim_then_resolves_it_to_slashed() -> None:
    k = kept()
    assert decide(k, PUBLISH_BY, TERMS, Observation(), can_claim=True).action == "wait"
    d = decide(k, PUBLISH_BY + 1, TERMS, Observation(), can_claim=True)
    assert d.action == "claim" and "in no batch committed by" in (d.kept.note or "")
    c = replace(d.kept, state=State.CLAIMED, claim_id=4, deadline=PUBLISH_BY + 601)
    d = decide(c, PUBLISH_BY + 601, TERMS, Observation(claim=(ClaimStatus.OPEN,
                                                              PUBLISH_BY + 601)),
               can_claim=True)
    assert d.action == "wait"
    d = decide(c, PUBLISH_BY + 602, TERMS, Observation(claim=(ClaimStatus.OPEN,
                                                              PUBLISH_BY + 601)),
               can_claim=True)
    assert d.action == "resolve"
    d = decide(c, PUBLISH_BY + 603, TERMS, Observation(claim=(ClaimStatus.SLASHED,
                                                              PUBLISH_BY + 601)),
               can_claim=True)
    assert (d.action, d.kept.state) == ("move", State.SLASHED)


def test_a_batch_committed_after_the_deadline_is_claimed() -> None:
    d = decide(kept(), PUBLISH_BY + 5, TERMS, Observation(found=leaf(PUBLISH_BY + 1)),
               can_claim=True)
    assert d.action == "claim" and "committed after" in (d.kept.note or "")


def test_a_claim_waits_for_unreadable_manifests_of_its_operator() -> None:
    d = decide(kept(), PUBLISH_BY + 5, TERMS, Observation(unread_batches=2), can_claim=True)
    assert (d.action, d.kept.state) == ("wait", State.PENDING)
    assert "2 batch manifest(s)" in (d.kept.note or "")


def test_watch_only_and_a_closed_claim_window_end_late() -> None:
    d = decide(kept(), PUBLISH_BY + 1, TERMS, Observation(), can_claim=False)
    assert (d.action, d.kept.state) == ("move", State.LATE)
    d = decide(kept(), PUBLISH_BY + TERMS.claim_window + 1, TERMS, Observation(),
               can_claim=True)
    assert (d.action, d.kept.state) == ("move", State.LATE)
    assert "claim window closed" in (d.kept.note or "")


def test_an_answered_claim_returns_to_pending_and_is_never_claimed_again() -> None:
    c = kept(State.CLAIMED, claim_id=9)
    d = decide(c, PUBLISH_BY + 50, TERMS, Observation(claim=(ClaimStatus.ANSWERED, 0)),
               can_claim=True)
    assert (d.action, d.kept.state, d.kept.claim_answered) == ("move", State.PENDING, True)
    p = d.kept
    assert decide(p, PUBLISH_BY + 60, TERMS, Observation(), can_claim=True).action == "wait"
    d = decide(p, PUBLISH_BY + TERMS.da_grace_s + 1, TERMS, Observation(), can_claim=True)
    assert (d.action, d.kept.state) == ("move", State.UNAVAILABLE)
    # found meanwhile: it goes on as any batched receipt
    d = decide(p, PUBLISH_BY + 60, TERMS, Observation(found=leaf(PUBLISH_BY)), can_claim=True)
    assert d.kept.state is State.BATCHED


def test_a_claim_a_reorg_took_away_is_decided_again() -> None:
    c = kept(State.CLAIMED, claim_id=5)
    d = decide(c, PUBLISH_BY + 50, TERMS, Observation(claim=(ClaimStatus.NONE, 0)),
               can_claim=True)
    assert (d.action, d.kept.state, d.kept.claim_id) == ("move", State.PENDING, None)
    assert decide(d.kept, PUBLISH_BY + 51, TERMS, Observation(), can_claim=True).action == \
        "claim"


# ---- the store -----------------------------------------------------------------------------------
def test_the_store_survives_a_restart_with_wal_and_a_schema_version(tmp_path: Path) -> None:
    clock = FakeClock()
    path = tmp_path / "keep" / "receipts.sqlite"
    with ReceiptStore(path, clock=clock) as store:
        s = signed(1)
        assert store.add(s) and not store.add(s)  # idempotent
        k = store.get(to_hex(s.digest))
        clock.advance(5)
        k2 = store.update(k, replace(k, state=State.BATCHED, note="in batch", committed_at=7))
        assert k2.version == 1 and k2.updated_at == clock.t
        store.add_batches([], cursor=41)
    with ReceiptStore(path, clock=clock) as again:
        got = again.get(to_hex(s.digest))
        assert (got.state, got.committed_at, got.signed) == (State.BATCHED, 7, s)
        assert [st for _, st, _ in again.history(got.id)] == [State.PENDING, State.BATCHED]
        assert again.meta("cursor") == "41" and again.schema_version == SCHEMA_VERSION
    db = sqlite3.connect(path)
    assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    db.close()


def test_an_update_from_a_stale_read_is_refused(tmp_path: Path) -> None:
    store = ReceiptStore(tmp_path / "r.sqlite", clock=FakeClock())
    s = signed(2)
    store.add(s)
    k = store.get(to_hex(s.digest))
    store.update(k, replace(k, note="first writer"))
    with pytest.raises(StoreConflictError):
        store.update(k, replace(k, state=State.FINAL))
    assert store.get(k.id).state is State.PENDING
    with pytest.raises(UnknownReceiptError):
        store.get("0x" + "00" * 32)


def test_a_newer_schema_or_a_foreign_file_is_refused_not_rewritten(tmp_path: Path) -> None:
    newer = tmp_path / "newer.sqlite"
    db = sqlite3.connect(newer)
    db.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    db.close()
    with pytest.raises(StoreError, match="newer"):
        ReceiptStore(newer)
    foreign = tmp_path / "foreign.sqlite"
    db = sqlite3.connect(foreign)
    db.execute("CREATE TABLE t(x)")
    db.commit()
    db.close()
    with pytest.raises(StoreError, match="not a receipt store"):
        ReceiptStore(foreign)


def test_a_store_keeps_one_deployment(tmp_path: Path) -> None:
    store = ReceiptStore(tmp_path / "r.sqlite")
    store.bind_deployment(31337, "0x" + "11" * 20)
    store.bind_deployment(31337, "0x" + "11" * 20)
    with pytest.raises(StoreError, match="keeps receipts of deployment"):
        store.bind_deployment(1, "0x" + "11" * 20)


def test_status_counts_states_the_next_deadline_and_failures(tmp_path: Path) -> None:
    store = ReceiptStore(tmp_path / "r.sqlite", clock=FakeClock())
    a, b, c = signed(10), signed(11), signed(12)
    for s in (a, b, c):
        store.add(s)
    ka, kb, kc = (store.get(to_hex(s.digest)) for s in (a, b, c))
    store.update(ka, replace(ka, deadline=PUBLISH_BY))
    store.update(kb, replace(kb, state=State.BATCHED, deadline=PUBLISH_BY - 100,
                             failures=2, last_error="rpc_deadline"))
    store.update(kc, replace(kc, state=State.SLASHED, note="claim 3 upheld"))
    st = status_of(store).to_json()
    assert st["counts"]["pending"] == 1 and st["counts"]["batched"] == 1
    assert st["counts"]["slashed"] == 1 and st["counts"]["final"] == 0
    assert st["next_deadline"] == {"receipt": kb.id, "state": "batched",
                                   "deadline": PUBLISH_BY - 100}
    assert {f["receipt"] for f in st["failures"]} == {kb.id, kc.id}


# ---- deadlines and settings ----------------------------------------------------------------------
def test_bounded_gives_up_at_its_deadline() -> None:
    release = threading.Event()
    with pytest.raises(RpcDeadlineError, match="no answer within"):
        call_within("stuck", lambda: release.wait(30), 0.05)
    release.set()
    assert call_within("quick", lambda: 42, 5) == 42
    with pytest.raises(ValueError, match="boom"):
        call_within("fails", lambda: (_ for _ in ()).throw(ValueError("boom")), 5)


def test_the_policy_is_checked_once_at_the_boundary() -> None:
    with pytest.raises(KeeperConfigError):
        KeeperPolicy(rpc_deadline_s=0)
    with pytest.raises(KeeperConfigError):
        KeeperPolicy(da_grace_s=-1)


def test_backoff_is_bounded_and_jittered_by_the_injected_rng() -> None:
    p = KeeperPolicy()
    assert p.backoff.delay(1, lambda: 0.5) == pytest.approx(1.0)
    assert p.backoff.delay(3, lambda: 0.5) == pytest.approx(4.0)
    assert p.backoff.delay(50, lambda: 1.0) == pytest.approx(60.0 * 1.2)


# ---- the CLI over the store (no chain) -----------------------------------------------------------
def test_client_add_keeps_signed_receipts_and_status_shows_them(tmp_path: Path) -> None:
    import json

    from typer.testing import CliRunner

    from verinfer.chain.deploy import Deployment
    from verinfer.cli import app

    dep = tmp_path / "deployment.json"
    Deployment(31337, "0x" + "01" * 20, "0x" + "02" * 20, "0x" + "03" * 20,
               DOMAIN.verifying_contract, "0x" + "05" * 20, 1).save(dep)
    good = tmp_path / "good.json"
    good.write_text(json.dumps(signed(20).to_json()))
    other = tmp_path / "other.json"
    other.write_text(json.dumps(SignedReceipt.sign(
        replace(signed(21).receipt, chain_id=5), Domain(5, DOMAIN.verifying_contract),
        SIGNER).to_json()))
    store = tmp_path / "r.sqlite"
    runner = CliRunner()
    r = runner.invoke(app, ["client", "add", str(good), str(good), "--receipts", str(store),
                            "--deployment", str(dep)])
    assert r.exit_code == 0, r.output
    assert json.loads(r.output.strip().splitlines()[-1])["added"] == 1
    r = runner.invoke(app, ["client", "add", str(other), "--receipts", str(store),
                            "--deployment", str(dep)])
    assert r.exit_code == 2 and "not for this chain" in r.output, r.output
    r = runner.invoke(app, ["client", "status", "--json", "--receipts", str(store)])
    assert r.exit_code == 0, r.output
    st = json.loads(r.output)
    assert st["counts"]["pending"] == 1 and st["failures"] == []
    r = runner.invoke(app, ["client", "status", "--receipts", str(store)])
    assert "pending      1" in r.output and "next deadline: not known yet" in r.output
