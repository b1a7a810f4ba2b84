"""Attacks on committees while governance approves two engine fingerprints for one model (an
image upgrade): a verifier judges only receipts under its own fingerprint and abstains on any
other, so a committee must come from the verifiers declared for the receipt's fingerprint.
One test per attack, on a real anvil through the Python bindings (docs/contracts.md
"Fingerprint pools"):

* the low-coverage cheat: sign a tampered receipt under the fingerprint fewest verifiers run;
* declare after the seed: join the pool once blockhash(target) is public;
* undeclare to dodge: leave the pool (or unbond) after the open to escape the vote;
* verifiers leave after an honest operator signed: the operator must not be slashed;
* a sybil alone in a small pool: the operator's own minimum-stake verifier is the only one
  declared for a fingerprint, so it would judge the operator's receipts (coverage is measured
  in stake: such a receipt is uncovered, slashed at open);
* the lone challenger: the only declared verifier of a fingerprint catches a cheat and
  challenges; excluding it would leave no committee (it sits);
* a large bond after an honest operator signed: later receipts become uncovered, the earlier
  one must not be slashed.

Each test also shows what the pre-fix rule (a draw over every verifier, live state, no delay)
would have given, so it fails without the fix.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from eth_account.signers.local import LocalAccount
from web3 import Web3

from verinfer.chain.anvil import Anvil, dev_accounts, increase_time, mine
from verinfer.chain.bindings import Contracts, TxSender, vote_commitment
from verinfer.chain.deploy import Deployment, deploy_all
from verinfer.chain.errors import ContractRevertError
from verinfer.chain.signing import sign_receipt_typed
from verinfer.chain.stake import ensure_declared
from verinfer.chain.structs import (
    COVERAGE_NOTICE,
    ETHER,
    MIN_COVERAGE_BPS,
    Kind,
    Role,
    Status,
    default_params,
    pool_key,
)
from verinfer.receipts.eip712 import Domain, Receipt
from verinfer.receipts.merkle import build_tree
from verinfer.verifier.chain_view import ChainView
from verinfer.verifier.node import NodeConfig, VerifierNode

MODEL = hashlib.sha256(b"weights").digest()
FP_OLD = hashlib.sha256(b"engine fingerprint: image v1").digest()  # 4 verifiers run it
FP_NEW = hashlib.sha256(b"engine fingerprint: image v2").digest()  # approved, few run it
MODEL_B = hashlib.sha256(b"other weights").digest()  # approved; the FP_OLD verifiers lack it
# draw pools and coverage are per (fingerprint, model)
POOL_OLD, POOL_NEW = pool_key(FP_OLD, MODEL), pool_key(FP_NEW, MODEL)
ALL_VERIFIERS = b"\x00" * 32
HONEST = hashlib.sha256(b"honest output").digest()
TAMPERED = hashlib.sha256(b"tampered output").digest()
P = default_params()


@dataclass
class Net:
    w3: Web3
    d: Deployment
    gov: LocalAccount
    operator: LocalAccount
    challenger: LocalAccount
    old: list[LocalAccount]  # verifiers running FP_OLD
    new: LocalAccount  # a verifier running FP_NEW (registered, declared only where a test says)
    spare: list[LocalAccount]

    def as_(self, who: LocalAccount) -> Contracts:
        return self.d.bind(self.w3, TxSender(self.w3, who))

    @property
    def view(self) -> Contracts:
        return self.d.bind(self.w3)

    def now(self) -> int:
        return int(self.w3.eth.get_block("latest")["timestamp"])


def _deploy_net(w3: Web3, min_coverage_bps: int = MIN_COVERAGE_BPS) -> Net:
    """A deployment with 4 FP_OLD verifiers (1 ETH each) and ``new`` registered (1 ETH)."""
    a = dev_accounts(10)
    d = deploy_all(w3, a[0], P, min_coverage_bps=min_coverage_bps)
    n = Net(w3, d, a[0], a[1], a[2], a[3:7], a[7], a[8:10])
    gov = n.as_(n.gov)
    gov.config.approve(Kind.MODEL, MODEL)
    gov.config.approve(Kind.MODEL, MODEL_B)
    gov.config.approve(Kind.ENGINE_FINGERPRINT, FP_OLD)
    gov.config.approve(Kind.ENGINE_FINGERPRINT, FP_NEW)
    gov.config.register_key_epoch(1, b"\x04" * 32, b"\x11" * 32, 2, 3)
    n.as_(n.operator).stakes.register(Role.OPERATOR, 5 * ETHER)
    for v in n.old:
        n.as_(v).stakes.register(Role.VERIFIER, ETHER)
        decl = ensure_declared(n.as_(v), v.address, [(FP_OLD, MODEL)])
        assert decl.declared == ((FP_OLD, MODEL),)
    n.as_(n.new).stakes.register(Role.VERIFIER, ETHER)
    assert n.view.stakes.coverage_notice() == COVERAGE_NOTICE
    assert n.view.stakes.min_coverage_bps() == min_coverage_bps
    increase_time(w3, COVERAGE_NOTICE)  # receipts rely on coverage this long before them
    return n


@pytest.fixture
def net() -> Iterator[Net]:
    with Anvil() as node:
        yield _deploy_net(node.web3())


@dataclass
class Opened:
    cid: int
    receipt: Receipt


def _post(net: Net, fp: bytes, out: bytes, tag: bytes, model: bytes = MODEL
          ) -> tuple[Receipt, bytes, object, Domain]:
    """A committed two-receipt batch of ``model`` under ``fp``, issued now; returns its first
    receipt."""
    domain = Domain(chain_id=net.d.chain_id, verifying_contract=net.d.challenge_manager)
    rs = [Receipt(operator=net.operator.address, chain_id=net.d.chain_id, model_id=model,
                  engine_fingerprint_hash=fp, req_hash=hashlib.sha256(tag + b"%d" % i).digest(),
                  out_hash=out, key_epoch=1,
                  ciphertext_hash=hashlib.sha256(b"ct" + tag + b"%d" % i).digest(),
                  issued_at=net.now())
          for i in range(2)]
    tree = build_tree([r.digest(domain) for r in rs])
    net.as_(net.operator).batches.commit_batch(tree.root, 2, "da://local/0x" + "ab" * 32)
    return rs[0], tree.root, tree, domain


def _open(net: Net, receipt: Receipt, root: bytes, tree: object, domain: Domain,
          by: LocalAccount | None = None) -> int:
    """Opens a challenge of ``receipt`` (leaf 0) from ``by`` (default: the challenger)."""
    proof = tree.proof(0)  # type: ignore[attr-defined]
    return net.as_(by or net.challenger).challenges.open_challenge(
        receipt, sign_receipt_typed(receipt, domain, net.operator), root, proof.index,
        proof.siblings, P.challenge_bond)


def _post_and_open(net: Net, fp: bytes, out: bytes, tag: bytes,
                   by: LocalAccount | None = None, model: bytes = MODEL) -> Opened:
    receipt, root, tree, domain = _post(net, fp, out, tag, model)
    return Opened(_open(net, receipt, root, tree, domain, by), receipt)


def _vote(net: Net, cid: int, votes: dict[str, bytes | None]) -> None:
    """Members commit and reveal ``votes[address]`` (None: the member does not take part)."""
    by_addr = {v.address: v for v in [*net.old, net.new, *net.spare]}
    salt = b"\x07" * 32
    for addr, out in votes.items():
        if out is not None:
            net.as_(by_addr[addr]).challenges.commit_vote(
                cid, vote_commitment(cid, addr, out, salt))
    increase_time(net.w3, P.commit_period + 1)
    for addr, out in votes.items():
        if out is not None:
            net.as_(by_addr[addr]).challenges.reveal_vote(cid, out, salt)
    increase_time(net.w3, P.reveal_period + 1)
    net.as_(net.challenger).challenges.resolve(cid)


def _seed_and_snapshot(net: Net, cid: int) -> tuple[bytes, int]:
    info = net.view.challenges.challenge(cid)
    bh = bytes(net.w3.eth.get_block(info.target_block)["hash"])
    return Web3.keccak(bh + cid.to_bytes(32, "big")), info.snapshot_block


def _draw_from(net: Net, pool: bytes, seed: bytes, snapshot: int,
               exclude: str | None = None) -> list[str]:
    """StakeRegistry.drawCommittee over ``pool`` (ALL_VERIFIERS: the pre-fix draw), skipping
    ``exclude`` (default: the challenger)."""
    members, _, _ = net.view.stakes.contract.functions.drawCommittee(
        pool, seed, snapshot, P.committee_size, exclude or net.challenger.address).call()
    return [str(m) for m in members]


def _rpc(w3: Web3, method: str, *params: object) -> object:
    return w3.provider.make_request(method, list(params))["result"]  # type: ignore[arg-type]


def test_low_coverage_cheat_is_slashed_not_inconclusive(net: Net) -> None:
    """The operator signs a tampered receipt under FP_NEW, which only ``net.new`` runs.
    Uncovered (nobody declared FP_NEW): the receipt is invalid on its face, slashed at open.
    Covered by one verifier: the committee is that verifier, whose vote slashes. The pre-fix
    draw over every verifier seats FP_OLD verifiers, who abstain: short of quorum."""
    before = net.view.stakes.account_of(net.operator.address).stake
    uncovered = _post_and_open(net, FP_NEW, TAMPERED, b"uncovered")
    info = net.view.challenges.challenge(uncovered.cid)
    assert info.status is Status.SLASHED and info.members == 0
    assert net.view.stakes.account_of(net.operator.address).stake == before - P.slash_amount

    decl = ensure_declared(net.as_(net.new), net.new.address, [(FP_NEW, MODEL)])
    assert decl.declared == ((FP_NEW, MODEL),)
    increase_time(net.w3, COVERAGE_NOTICE)
    covered = _post_and_open(net, FP_NEW, TAMPERED, b"covered")
    assert net.view.challenges.challenge(covered.cid).pool == POOL_NEW
    mine(net.w3, P.draw_delay_blocks + 1)
    net.as_(net.challenger).challenges.draw_committee(covered.cid)
    members = [m.account for m in net.view.challenges.committee(covered.cid)]
    assert members == [net.new.address]
    seed, snapshot = _seed_and_snapshot(net, covered.cid)
    old_rule = _draw_from(net, ALL_VERIFIERS, seed, snapshot)
    able = [m for m in old_rule if m == net.new.address]
    assert len(able) * 10_000 < P.quorum_bps * len(old_rule)  # equal weights: no quorum possible
    _vote(net, covered.cid, {net.new.address: HONEST})  # FP_NEW really gives HONEST
    assert net.view.challenges.challenge(covered.cid).status is Status.SLASHED
    assert net.view.stakes.account_of(net.operator.address).stake == before - 2 * P.slash_amount


def test_fraud_on_a_model_few_hold_is_slashed(net: Net) -> None:
    """Issue 31 finding 4. The 4 FP_OLD verifiers hold only MODEL; the own engine's fingerprint
    is the same for every model. A tampered MODEL_B receipt under FP_OLD: before, its
    committee came from FP_OLD's pool (all MODEL holders, who abstain): Inconclusive, each
    member paid the non-reveal penalty, the bond came back. Now (FP_OLD, MODEL_B) is its own
    pool: uncovered, slashed at open; once ``net.new`` declares it, ``net.new`` alone judges."""
    assert net.view.stakes.is_covered_at(POOL_OLD, net.now())
    assert not net.view.stakes.is_covered_at(pool_key(FP_OLD, MODEL_B), net.now())
    stakes_before = {v.address: net.view.stakes.account_of(v.address).stake for v in net.old}
    before = net.view.stakes.account_of(net.operator.address).stake
    uncovered = _post_and_open(net, FP_OLD, TAMPERED, b"model-b", model=MODEL_B)
    info = net.view.challenges.challenge(uncovered.cid)
    assert info.status is Status.SLASHED and info.members == 0
    assert net.view.stakes.account_of(net.operator.address).stake == before - P.slash_amount

    decl = ensure_declared(net.as_(net.new), net.new.address, [(FP_OLD, MODEL_B)])
    assert decl.declared == ((FP_OLD, MODEL_B),)
    increase_time(net.w3, COVERAGE_NOTICE)
    covered = _post_and_open(net, FP_OLD, TAMPERED, b"model-b covered", model=MODEL_B)
    assert net.view.challenges.challenge(covered.cid).pool == pool_key(FP_OLD, MODEL_B)
    assert _draw(net, covered.cid) == [net.new.address]
    _vote(net, covered.cid, {net.new.address: HONEST})  # MODEL_B really gives HONEST
    assert net.view.challenges.challenge(covered.cid).status is Status.SLASHED
    assert {v.address: net.view.stakes.account_of(v.address).stake
            for v in net.old} == stakes_before  # no MODEL holder drawn nor penalised


def test_declare_after_seed_is_never_drawn(net: Net) -> None:
    """Once blockhash(target) is public, two heavy accounts register and declare FP_OLD.
    The draw reads FP_OLD's pool at the open block: they are never seated, though a draw of
    the live pool (the rule without checkpoints) seats them."""
    opened = _post_and_open(net, FP_OLD, HONEST, b"grind")
    mine(net.w3, P.draw_delay_blocks + 1)  # the seed exists now
    for s in net.spare:
        net.as_(s).stakes.register(Role.VERIFIER, 500 * ETHER)
        ensure_declared(net.as_(s), s.address, [(FP_OLD, MODEL)])
    mine(net.w3, 1)
    seed, snapshot = _seed_and_snapshot(net, opened.cid)
    live = _draw_from(net, POOL_OLD, seed, net.w3.eth.block_number - 1)
    assert {s.address for s in net.spare} & set(live), "a live-state draw seats the newcomers"
    net.as_(net.challenger).challenges.draw_committee(opened.cid)
    members = {m.account for m in net.view.challenges.committee(opened.cid)}
    assert members <= {v.address for v in net.old}
    assert members == set(_draw_from(net, POOL_OLD, seed, snapshot))


def test_undeclare_to_dodge_does_not_escape(net: Net) -> None:
    """After the open every FP_OLD verifier asks to leave FP_OLD and tries to unbond. The
    committee is the one drawn without that; leaving early and unbonding below the minimum
    revert; a member that then does not reveal pays the non-reveal penalty."""
    opened = _post_and_open(net, FP_OLD, TAMPERED, b"dodge")
    mine(net.w3, P.draw_delay_blocks + 1)
    snap = _rpc(net.w3, "evm_snapshot")
    net.as_(net.challenger).challenges.draw_committee(opened.cid)
    baseline = net.view.challenges.committee(opened.cid)
    assert _rpc(net.w3, "evm_revert", snap)
    for v in net.old:
        net.as_(v).stakes.undeclare_fingerprint(FP_OLD, MODEL)
        with pytest.raises(ContractRevertError) as e:
            net.as_(v).stakes.complete_undeclare(v.address, FP_OLD, MODEL)
        assert e.value.error_name == "UndeclareNotReady"
        with pytest.raises(ContractRevertError) as e:
            net.as_(v).stakes.request_unbond(ETHER)
        assert e.value.error_name == "DeclaredVerifierBelowMinimum"
    assert net.view.stakes.coverage_at(POOL_OLD, net.now()) == 0  # no new receipt may rely on them
    net.as_(net.challenger).challenges.draw_committee(opened.cid)
    members = net.view.challenges.committee(opened.cid)
    assert members == baseline and len(members) == P.committee_size
    dodger = members[0].account
    stakes_before = {m.account: net.view.stakes.account_of(m.account).stake for m in members}
    _vote(net, opened.cid, {m.account: (None if m.account == dodger else HONEST)
                            for m in members})
    for m in members:
        penalty = P.non_reveal_penalty if m.account == dodger else 0
        assert net.view.stakes.account_of(m.account).stake == stakes_before[m.account] - penalty


def test_honest_operator_not_slashed_after_verifiers_leave(net: Net) -> None:
    """An honest receipt is signed while FP_OLD is covered; then every FP_OLD verifier asks to
    leave. A challenge at the end of the window is not an invalid receipt (coverage is read at
    issuedAt), the leaving verifiers are still drawn and dismiss it. A receipt signed after
    they asked to leave is uncovered, which the operator can see (``is_covered_at``) and must
    refuse to sign: it is slashed at open."""
    receipt, root, tree, domain = _post(net, FP_OLD, HONEST, b"honest")
    assert net.view.stakes.is_covered_at(POOL_OLD, receipt.issued_at)
    increase_time(net.w3, 1)
    for v in net.old:
        net.as_(v).stakes.undeclare_fingerprint(FP_OLD, MODEL)
    # receipts from now + notice on are uncovered; the operator sees it that long ahead
    assert not net.view.stakes.is_covered_at(POOL_OLD, net.now() + COVERAGE_NOTICE)
    assert net.view.stakes.is_covered_at(POOL_OLD, net.now() + COVERAGE_NOTICE - 2)
    increase_time(net.w3, P.challenge_window - 60)  # the end of the receipt's window
    before = net.view.stakes.account_of(net.operator.address).stake
    cid = _open(net, receipt, root, tree, domain)
    assert net.view.challenges.challenge(cid).status is Status.AWAITING_DRAW
    mine(net.w3, P.draw_delay_blocks + 1)
    net.as_(net.challenger).challenges.draw_committee(cid)
    members = net.view.challenges.committee(cid)
    assert len(members) == P.committee_size
    _vote(net, cid, {m.account: HONEST for m in members})
    assert net.view.challenges.challenge(cid).status is Status.DISMISSED
    assert net.view.stakes.account_of(net.operator.address).stake == before

    late = _post_and_open(net, FP_OLD, HONEST, b"late")
    assert net.view.challenges.challenge(late.cid).status is Status.SLASHED


def _draw(net: Net, cid: int) -> list[str]:
    mine(net.w3, P.draw_delay_blocks + 1)
    net.as_(net.challenger).challenges.draw_committee(cid)
    return [m.account for m in net.view.challenges.committee(cid)]


def test_sybil_alone_in_a_small_pool_is_slashed_at_open(net: Net) -> None:
    """The operator registers a sybil verifier with the minimum stake, declares FP_NEW (which
    nobody else declared) and signs a tampered receipt under it. The sybil holds 2% of all
    verifier weight, under the 10% coverage share: the receipt is invalid on its face, slashed at
    open. With the pre-fix rule (any declared weight covers: the same contracts deployed with
    minCoverageBps = 0, on the same chain) the sybil is the whole committee and dismisses it."""
    sybil = net.spare[0]
    net.as_(sybil).stakes.register(Role.VERIFIER, P.min_verifier_stake)
    ensure_declared(net.as_(sybil), sybil.address, [(FP_NEW, MODEL)])
    increase_time(net.w3, COVERAGE_NOTICE)
    assert net.view.stakes.coverage_at(POOL_NEW, net.now()) == 1  # one declared verifier
    assert not net.view.stakes.is_covered_at(POOL_NEW, net.now())
    before = net.view.stakes.account_of(net.operator.address).stake
    opened = _post_and_open(net, FP_NEW, TAMPERED, b"sybil")
    info = net.view.challenges.challenge(opened.cid)
    assert info.status is Status.SLASHED and info.members == 0
    assert net.view.stakes.account_of(net.operator.address).stake == before - P.slash_amount

    old = _deploy_net(net.w3, min_coverage_bps=0)
    old.as_(sybil).stakes.register(Role.VERIFIER, P.min_verifier_stake)
    ensure_declared(old.as_(sybil), sybil.address, [(FP_NEW, MODEL)])
    increase_time(old.w3, COVERAGE_NOTICE)
    captured = _post_and_open(old, FP_NEW, TAMPERED, b"sybil")
    assert old.view.challenges.challenge(captured.cid).status is Status.AWAITING_DRAW
    assert _draw(old, captured.cid) == [sybil.address]
    _vote(old, captured.cid, {sybil.address: TAMPERED})  # the sybil votes for its operator
    assert old.view.challenges.challenge(captured.cid).status is Status.DISMISSED


def test_lone_declared_verifier_challenges_and_sits(net: Net) -> None:
    """``net.new`` is FP_NEW's only declared verifier (1 of 5 ETH: covered). It catches a
    tampered FP_NEW receipt and challenges it itself. Excluding the challenger (the pre-fix
    draw) leaves nobody: Inconclusive, the cheat free. Now nobody else being drawable, it sits,
    and its vote slashes."""
    ensure_declared(net.as_(net.new), net.new.address, [(FP_NEW, MODEL)])
    increase_time(net.w3, COVERAGE_NOTICE)
    before = net.view.stakes.account_of(net.operator.address).stake
    opened = _post_and_open(net, FP_NEW, TAMPERED, b"lone", by=net.new)
    assert net.view.challenges.challenge(opened.cid).challenger == net.new.address
    assert _draw(net, opened.cid) == [net.new.address]
    seed, snapshot = _seed_and_snapshot(net, opened.cid)
    assert _draw_from(net, POOL_NEW, seed, snapshot, exclude=net.new.address) == []
    _vote(net, opened.cid, {net.new.address: HONEST})  # FP_NEW really gives HONEST
    assert net.view.challenges.challenge(opened.cid).status is Status.SLASHED
    assert net.view.stakes.account_of(net.operator.address).stake == before - P.slash_amount


def test_honest_receipt_survives_a_later_large_bond(net: Net) -> None:
    """FP_NEW is covered (1 of 5 ETH) when the operator signs. Then someone bonds 50 ETH as a
    verifier without declaring FP_NEW: FP_NEW falls under 10% of all weight, so receipts from
    coverageNotice on are uncovered (the operator sees it that long ahead and stops serving
    FP_NEW: the liveness cost). The earlier receipt is judged on the weights at its issuedAt:
    not an invalid receipt, dismissed by its committee, the operator keeps its stake."""
    ensure_declared(net.as_(net.new), net.new.address, [(FP_NEW, MODEL)])
    increase_time(net.w3, COVERAGE_NOTICE)
    receipt, root, tree, domain = _post(net, FP_NEW, HONEST, b"before-bond")
    assert net.view.stakes.is_covered_at(POOL_NEW, receipt.issued_at)
    increase_time(net.w3, 1)
    net.as_(net.spare[1]).stakes.register(Role.VERIFIER, 50 * ETHER)
    assert not net.view.stakes.is_covered_at(POOL_NEW, net.now() + COVERAGE_NOTICE)
    assert net.view.stakes.is_covered_at(POOL_NEW, receipt.issued_at)  # final
    increase_time(net.w3, P.challenge_window // 2)  # a challenge later in the window
    before = net.view.stakes.account_of(net.operator.address).stake
    cid = _open(net, receipt, root, tree, domain)
    assert net.view.challenges.challenge(cid).status is Status.AWAITING_DRAW
    assert _draw(net, cid) == [net.new.address]
    _vote(net, cid, {net.new.address: HONEST})
    assert net.view.challenges.challenge(cid).status is Status.DISMISSED
    assert net.view.stakes.account_of(net.operator.address).stake == before

    late = _post_and_open(net, FP_NEW, HONEST, b"after-bond")  # what the operator must refuse
    assert net.view.challenges.challenge(late.cid).status is Status.SLASHED


def test_a_node_restart_keeps_a_pending_undeclaration(net: Net, tmp_path: Path) -> None:
    """A verifier decides to leave a pool (undeclares; drawable until leaveAt), then its node
    restarts: the node's start-up declaration used to re-declare every model it holds, which
    cancels the pending undeclaration on chain, silently, so the verifier stays in the pool
    it chose to leave (and pays for every seat it does not judge once it drops the model).
    The node keeps the undeclaration and says so; an explicit declare still cancels it."""
    v = net.old[0]
    c = net.as_(v)
    c.stakes.undeclare_fingerprint(FP_OLD, MODEL)
    leave_at = net.view.stakes.declarations_of(v.address)[POOL_OLD]
    assert leave_at > 0
    node = VerifierNode(ChainView(net.w3, net.d, c), c, v,
                        judge=lambda *_: None,  # type: ignore[arg-type,return-value]
                        da=None,  # type: ignore[arg-type]
                        cfg=NodeConfig(tmp_path / "votes.json"))
    decl = node.ensure_declared([(FP_OLD, MODEL)])  # what `verinfer verifier run` does at start
    assert decl.declared == () and decl.leaving == (((FP_OLD, MODEL), leave_at),)
    assert net.view.stakes.declarations_of(v.address)[POOL_OLD] == leave_at  # still leaving
    # a pool the node holds no model for is reported (it would be drawn and penalised)
    decl = node.ensure_declared([(FP_OLD, MODEL_B)])
    assert (POOL_OLD, leave_at) in decl.others
    # the explicit `verinfer chain verifier declare` path cancels the undeclaration
    decl = ensure_declared(c, v.address, [(FP_OLD, MODEL)])
    assert decl.declared == ((FP_OLD, MODEL),)
    assert net.view.stakes.declarations_of(v.address)[POOL_OLD] == 0
