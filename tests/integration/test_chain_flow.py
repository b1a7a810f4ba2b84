"""End to end against a real anvil: deploy, stake, commit a batch, challenge a receipt signed
with eth-account, draw the committee, commit/reveal, resolve both ways, check balances; and the
issue-13 attacks through the Python bindings (self-claims, post-open unbonding, future-dated
receipts, forced abstention)."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from dataclasses import replace

import pytest
from eth_account.signers.local import LocalAccount
from web3 import Web3

from verinfer.chain.anvil import Anvil, dev_accounts, increase_time, mine
from verinfer.chain.bindings import Contracts, TxSender, vote_commitment
from verinfer.chain.deploy import Deployment, deploy_all
from verinfer.chain.errors import ContractRevertError
from verinfer.chain.events import batches_committed, challenges_resolved, committees_drawn
from verinfer.chain.signing import sign_receipt_typed
from verinfer.chain.structs import (
    COVERAGE_NOTICE,
    ETHER,
    INVALID_EVIDENCE,
    ClaimStatus,
    Kind,
    Role,
    Status,
    default_params,
)
from verinfer.receipts.eip712 import Domain, Receipt
from verinfer.receipts.merkle import build_tree

MODEL = hashlib.sha256(b"weights").digest()
FINGERPRINT = hashlib.sha256(b"engine fingerprint").digest()


class Net:
    def __init__(self, w3: Web3, d: Deployment, accts: list[LocalAccount]) -> None:
        self.w3, self.d = w3, d
        self.gov, self.operator, self.challenger = accts[0], accts[1], accts[2]
        self.verifiers = accts[3:7]

    def as_(self, who: LocalAccount) -> Contracts:
        return self.d.bind(self.w3, TxSender(self.w3, who))


@pytest.fixture(scope="module")
def net() -> Iterator[Net]:
    with Anvil() as node:
        w3 = node.web3()
        accts = dev_accounts(7)
        d = deploy_all(w3, accts[0], default_params())
        n = Net(w3, d, accts)
        gov = n.as_(n.gov)
        gov.config.approve(Kind.MODEL, MODEL)
        gov.config.approve(Kind.ENGINE_FINGERPRINT, FINGERPRINT)
        gov.config.register_key_epoch(1, b"\x04" * 32, b"\x11" * 32, 2, 3)
        n.as_(n.operator).stakes.register(Role.OPERATOR, 5 * ETHER)
        for v in n.verifiers:
            n.as_(v).stakes.register(Role.VERIFIER, ETHER)
            n.as_(v).stakes.declare_fingerprint(FINGERPRINT, MODEL)  # drawn for these receipts
        increase_time(w3, COVERAGE_NOTICE)  # receipts rely on coverage this long before them
        yield n


def _receipts(net: Net, outs: list[bytes]) -> list[Receipt]:
    now = int(net.w3.eth.get_block("latest")["timestamp"])
    return [Receipt(operator=net.operator.address, chain_id=net.d.chain_id, model_id=MODEL,
                    engine_fingerprint_hash=FINGERPRINT,
                    req_hash=hashlib.sha256(b"req%d" % i).digest(), out_hash=o, key_epoch=1,
                    ciphertext_hash=hashlib.sha256(b"ct%d" % i + o).digest(), issued_at=now)
            for i, o in enumerate(outs)]


def _post(net: Net, outs: list[bytes]) -> tuple[list[Receipt], Domain, bytes, object]:
    domain = Domain(chain_id=net.d.chain_id, verifying_contract=net.d.challenge_manager)
    rs = _receipts(net, outs)
    tree = build_tree([r.digest(domain) for r in rs])
    net.as_(net.operator).batches.commit_batch(tree.root, len(rs),
                                               "da://local/0x" + "ab" * 32)
    return rs, domain, tree.root, tree


def _challenge_and_vote(net: Net, receipt: Receipt, domain: Domain, root: bytes, tree: object,
                        index: int, votes: list[bytes]) -> int:
    sig = sign_receipt_typed(receipt, domain, net.operator)
    cm = net.as_(net.challenger).challenges
    assert cm.receipt_digest(receipt) == receipt.digest(domain)
    proof = tree.proof(index)  # type: ignore[attr-defined]
    cid = cm.open_challenge(receipt, sig, root, proof.index, proof.siblings,
                            default_params().challenge_bond)
    mine(net.w3, default_params().draw_delay_blocks + 1)
    cm.draw_committee(cid)
    members = cm.committee(cid)
    assert len(members) == 3
    by_addr = {v.address: v for v in net.verifiers}
    for m, out in zip(members, votes, strict=True):
        salt = hashlib.sha256(m.account.encode() + out).digest()
        net.as_(by_addr[m.account]).challenges.commit_vote(
            cid, vote_commitment(cid, m.account, out, salt))
    for m, out in zip(members, votes, strict=True):
        salt = hashlib.sha256(m.account.encode() + out).digest()
        net.as_(by_addr[m.account]).challenges.reveal_vote(cid, out, salt)
    cm.resolve(cid)
    return cid


def test_chain_challenge_dismissed_pays_committee(net: Net) -> None:
    out = hashlib.sha256(b"honest").digest()
    rs, domain, root, tree = _post(net, [out, hashlib.sha256(b"x").digest(), out])
    view = net.d.bind(net.w3)
    stake_before = view.stakes.account_of(net.operator.address).stake
    cid = _challenge_and_vote(net, rs[2], domain, root, tree, 2, [out, out, out])
    info = view.challenges.challenge(cid)
    assert info.status is Status.DISMISSED and info.majority_out_hash == out
    assert view.stakes.account_of(net.operator.address).stake == stake_before
    paid = sum(view.challenges.credits(m.account) for m in view.challenges.committee(cid))
    assert paid + view.challenges.total_burnt() >= default_params().challenge_bond
    assert any(e.challenge_id == cid and e.status is Status.DISMISSED
               for e in challenges_resolved(view.challenges))
    assert any(b.root == root for b in batches_committed(view.batches))
    assert [c.challenge_id for c in committees_drawn(view.challenges)].count(cid) == 1


def test_chain_challenge_slashes_operator_and_pays_challenger(net: Net) -> None:
    claimed = hashlib.sha256(b"claimed").digest()
    actual = hashlib.sha256(b"what re-execution gives").digest()
    rs, domain, root, tree = _post(net, [claimed])
    view = net.d.bind(net.w3)
    p = default_params()
    stake_before = view.stakes.account_of(net.operator.address).stake
    credits_before = view.challenges.credits(net.challenger.address)
    cid = _challenge_and_vote(net, rs[0], domain, root, tree, 0, [actual] * 3)
    info = view.challenges.challenge(cid)
    assert info.status is Status.SLASHED and info.majority_out_hash == actual
    assert view.stakes.account_of(net.operator.address).stake == stake_before - p.slash_amount
    alpha = p.slash_amount * p.challenger_reward_bps // 10_000
    assert view.challenges.credits(net.challenger.address) == \
        credits_before + p.challenge_bond + alpha
    assert view.challenges.receipt_slashed(rs[0].digest(domain))
    # Withdraw the credits: the challenger's balance grows by exactly that minus gas.
    bal = net.w3.eth.get_balance(net.challenger.address)
    tx = net.as_(net.challenger).challenges.withdraw_credits()
    gas = tx["gasUsed"] * tx["effectiveGasPrice"]
    assert net.w3.eth.get_balance(net.challenger.address) == \
        bal + credits_before + p.challenge_bond + alpha - gas
    # The same receipt can never be slashed again.
    with pytest.raises(ContractRevertError) as e:
        net.as_(net.challenger).challenges.open_challenge(
            rs[0], sign_receipt_typed(rs[0], domain, net.operator), root, 0, (),
            p.challenge_bond)
    assert e.value.error_name == "ReceiptAlreadySlashed"


def test_chain_bad_inputs_revert_with_typed_errors(net: Net) -> None:
    out = hashlib.sha256(b"o").digest()
    rs, domain, root, tree = _post(net, [out, out])
    cm = net.as_(net.challenger).challenges
    bond = default_params().challenge_bond
    proof = tree.proof(0)
    wrong_sig = sign_receipt_typed(rs[0], domain, net.challenger)
    with pytest.raises(ContractRevertError) as e:
        cm.open_challenge(rs[0], wrong_sig, root, 0, proof.siblings, bond)
    assert e.value.error_name == "SignerMismatch"
    assert e.value.error_args == (net.operator.address, net.challenger.address)
    other_chain = replace(rs[0], chain_id=1)
    with pytest.raises(ContractRevertError) as e:
        cm.open_challenge(other_chain, sign_receipt_typed(other_chain, domain, net.operator),
                          root, 0, proof.siblings, bond)
    assert e.value.error_name == "WrongChainId"
    sig = sign_receipt_typed(rs[0], domain, net.operator)
    with pytest.raises(ContractRevertError) as e:
        cm.open_challenge(rs[0], sig, root, 1, proof.siblings, bond)
    assert e.value.error_name == "InvalidMerkleProof"
    increase_time(net.w3, default_params().challenge_window + 1)
    with pytest.raises(ContractRevertError) as e:
        cm.open_challenge(rs[0], sig, root, 0, proof.siblings, bond)
    assert e.value.error_name == "ChallengeWindowClosed"


def _rpc(w3: Web3, method: str, *params: object) -> object:
    resp = w3.provider.make_request(method, list(params))  # type: ignore[arg-type]
    return resp["result"]


def test_chain_unbond_after_open_does_not_move_committee(net: Net) -> None:
    """Issue 13 attack 2: once blockhash(target) is public, verifiers unbond before the draw.
    The committee is the one of the weights at the open block, whatever they do."""
    out = hashlib.sha256(b"steer").digest()
    rs, domain, root, tree = _post(net, [out, out])
    p = default_params()
    cm = net.as_(net.challenger).challenges
    proof = tree.proof(1)
    cid = cm.open_challenge(rs[1], sign_receipt_typed(rs[1], domain, net.operator), root,
                            proof.index, proof.siblings, p.challenge_bond)
    view = net.d.bind(net.w3)
    info = view.challenges.challenge(cid)
    assert info.snapshot_block == info.target_block - p.draw_delay_blocks
    mine(net.w3, p.draw_delay_blocks + 1)
    snap = _rpc(net.w3, "evm_snapshot")
    cm.draw_committee(cid)
    baseline = view.challenges.committee(cid)
    assert _rpc(net.w3, "evm_revert", snap)
    snap = _rpc(net.w3, "evm_snapshot")
    # very different live weights; a declared verifier cannot unbond below the minimum
    amounts = [ETHER // 8 + 12345, ETHER // 4 + 1, ETHER // 2 + 7, ETHER - p.min_verifier_stake]
    for v, amount in zip(net.verifiers, amounts, strict=True):
        net.as_(v).stakes.request_unbond(amount)
    with pytest.raises(ContractRevertError) as e:
        net.as_(net.verifiers[3]).stakes.request_unbond(1)
    assert e.value.error_name == "DeclaredVerifierBelowMinimum"
    cm.draw_committee(cid)
    assert view.challenges.committee(cid) == baseline
    assert _rpc(net.w3, "evm_revert", snap)


def test_chain_self_claim_does_not_shield_fraud(net: Net) -> None:
    """Issue 13 attack 1: the operator claims its own receipts unpublished from a second
    address (liabilities on its stake, live claim on the fraudulent receipt); a real challenge
    still opens, and the proven fraud costs exactly slashAmount."""
    p = default_params()
    alt = dev_accounts(8)[7]
    claimed = hashlib.sha256(b"claimed 2").digest()
    actual = hashlib.sha256(b"re-executed 2").digest()
    rs, domain, root, tree = _post(net, [claimed, claimed])
    increase_time(net.w3, p.publication_deadline + 1)
    view = net.d.bind(net.w3)
    own = net.as_(alt).challenges
    locked_before = view.stakes.account_of(net.operator.address).locked  # earlier tests' disputes
    claims = [own.claim_unpublished(r, sign_receipt_typed(r, domain, net.operator),
                                    p.challenge_bond) for r in rs]
    acct = view.stakes.account_of(net.operator.address)
    assert acct.locked == locked_before + 2 * p.slash_amount
    stake_before = acct.stake
    cid = _challenge_and_vote(net, rs[0], domain, root, tree, 0, [actual] * 3)
    info = view.challenges.challenge(cid)
    assert info.status is Status.SLASHED and info.locked_stake == p.slash_amount
    assert view.stakes.account_of(net.operator.address).stake == stake_before - p.slash_amount
    state = view.challenges.receipt_state(rs[0].digest(domain))
    assert state.slashed and state.live_claim == claims[0]
    for i, c in enumerate(claims):  # answered in time: bond back to the operator, nothing taken
        proof = tree.proof(i)  # type: ignore[attr-defined]
        net.as_(net.operator).challenges.answer_unpublished(c, root, proof.index, proof.siblings)
        assert view.challenges.claim(c).status is ClaimStatus.ANSWERED
    acct = view.stakes.account_of(net.operator.address)
    assert acct.stake == stake_before - p.slash_amount and acct.locked == locked_before


def test_chain_far_future_receipt_claim_slashes_at_once(net: Net) -> None:
    """Issue 13 attack 4: issuedAt = 2^64 - 1 (formerly unclaimable, overflowing) is invalid on
    its face: the unpublished claim slashes at once."""
    p = default_params()
    view = net.d.bind(net.w3)
    domain = Domain(chain_id=net.d.chain_id, verifying_contract=net.d.challenge_manager)
    r = replace(_receipts(net, [hashlib.sha256(b"future").digest()])[0], issued_at=2**64 - 1)
    stake_before = view.stakes.account_of(net.operator.address).stake
    cid = net.as_(net.challenger).challenges.claim_unpublished(
        r, sign_receipt_typed(r, domain, net.operator), p.challenge_bond)
    assert view.challenges.claim(cid).status is ClaimStatus.SLASHED
    assert view.stakes.account_of(net.operator.address).stake == stake_before - p.slash_amount
    assert view.challenges.receipt_slashed(r.digest(domain))


def test_chain_invalid_evidence_votes_slash_without_penalty(net: Net) -> None:
    """Issue 13 attack 6: members who cannot use the operator's evidence reveal INVALID_EVIDENCE:
    no non-reveal penalty, and at quorum the operator is slashed."""
    p = default_params()
    out = hashlib.sha256(b"unverifiable").digest()
    rs, domain, root, tree = _post(net, [out])
    view = net.d.bind(net.w3)
    stakes_before = {v.address: view.stakes.account_of(v.address).stake for v in net.verifiers}
    op_before = view.stakes.account_of(net.operator.address).stake
    cid = _challenge_and_vote(net, rs[0], domain, root, tree, 0, [INVALID_EVIDENCE] * 3)
    info = view.challenges.challenge(cid)
    assert info.status is Status.SLASHED and info.majority_out_hash == INVALID_EVIDENCE
    assert view.stakes.account_of(net.operator.address).stake == op_before - p.slash_amount
    for v in net.verifiers:
        assert view.stakes.account_of(v.address).stake == stakes_before[v.address]
