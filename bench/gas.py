"""Gas of the hot contract paths, measured from real transaction receipts on anvil.

Commits a 1024-receipt batch, opens challenges on its receipts (10-sibling proofs; the first
challenge ever pays extra zero-to-nonzero storage writes, reported separately),
draws the committee, commits and reveals one vote; then registers 1,000 more verifiers and
draws a committee again (`draw_gas_1000_verifiers`: the draw reads a checkpointed Fenwick tree,
so its cost depends on the tree depth, not on the number of verifiers). gasUsed includes the
21000 intrinsic cost and calldata. Prints one JSON object as the last line.

``resolve_gas_worst`` (issue 31) is the costliest resolve the parameters allow, on a second
deployment: the largest committee ProtocolConfig accepts (MAX_COMMITTEE_SIZE), every member at
the minimum stake and declared on the most fingerprints allowed (StakeRegistry.MAX_DECLARATIONS),
none revealing, so each member's penalty takes it out of 1 + MAX_DECLARATIONS draw pools.

``--smoke`` (CI, tests/integration/test_bench_smoke.py): registers 20 more verifiers instead of
1,000, so ``draw_gas_1000_verifiers`` is then not that number; every other path is the same.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import time
from dataclasses import replace

from eth_account import Account
from eth_account.signers.local import LocalAccount
from web3 import Web3

from verinfer.chain.anvil import Anvil, dev_accounts, increase_time, mine
from verinfer.chain.bindings import Contracts, TxSender, vote_commitment
from verinfer.chain.deploy import deploy_all
from verinfer.chain.signing import sign_receipt_typed
from verinfer.chain.structs import ETHER, Kind, Role, default_params
from verinfer.receipts.eip712 import Domain, Receipt
from verinfer.receipts.merkle import build_tree

LEAVES = 1024
MANY_VERIFIERS = 1000
SMOKE_VERIFIERS = 20


def _register_many(w3: Web3, d: object, n: int, stake: int, fp: bytes, model: bytes
                   ) -> tuple[int, int]:
    """Registers n fresh verifiers (funded with anvil_setBalance), sending the signed
    transactions back to back and waiting for the last; each declares (``fp``, ``model``).
    Returns the largest
    gasUsed of a registration and of a declaration."""
    stakes = d.bind(w3).stakes.contract  # type: ignore[attr-defined]
    hashes, declares = [], []
    for i in range(n):
        acct = Account.from_key(hashlib.sha256(b"bench verifier %d" % i).digest())
        w3.provider.make_request("anvil_setBalance",  # type: ignore[arg-type]
                                 [acct.address, hex(stake + 10**17)])
        tx = stakes.functions.register(int(Role.VERIFIER)).build_transaction({
            "from": acct.address, "value": stake, "gas": 1_500_000, "nonce": 0,
            "chainId": w3.eth.chain_id, "maxFeePerGas": 10**10, "maxPriorityFeePerGas": 0})
        hashes.append(w3.eth.send_raw_transaction(acct.sign_transaction(tx).raw_transaction))
        # committees are drawn from the verifiers declared for the receipt's (fingerprint, model)
        tx = stakes.functions.declareFingerprint(fp, model).build_transaction({
            "from": acct.address, "gas": 1_500_000, "nonce": 1,
            "chainId": w3.eth.chain_id, "maxFeePerGas": 10**10, "maxPriorityFeePerGas": 0})
        declares.append(w3.eth.send_raw_transaction(acct.sign_transaction(tx).raw_transaction))
    worst = 0
    for h in hashes:
        r = w3.eth.wait_for_transaction_receipt(h, timeout=120)
        if r["status"] != 1:
            raise RuntimeError(f"register failed: {h.hex()}")
        worst = max(worst, int(r["gasUsed"]))
    worst_declare = 0
    for h in declares:
        r = w3.eth.wait_for_transaction_receipt(h, timeout=120)
        if r["status"] != 1:
            raise RuntimeError(f"declare failed: {h.hex()}")
        worst_declare = max(worst_declare, int(r["gasUsed"]))
    return worst, worst_declare


def _resolve_worst(w3: Web3, gov: LocalAccount, op: LocalAccount, challenger: LocalAccount
                   ) -> tuple[int, int, int]:
    """Deploys a fresh system with committee_size = MAX_COMMITTEE_SIZE, fills one pool with that
    many minimum-stake verifiers each declared on MAX_DECLARATIONS (fingerprint, model) pools,
    opens and draws
    a challenge that nobody votes on, and resolves it. Returns (resolve gasUsed, committee size,
    declarations per member)."""
    probe = deploy_all(w3, gov, default_params())
    n = int(probe.bind(w3).config.contract.functions.MAX_COMMITTEE_SIZE().call())
    decl = int(probe.bind(w3).stakes.contract.functions.MAX_DECLARATIONS().call())
    params = replace(default_params(), committee_size=n)
    d = deploy_all(w3, gov, params)

    def as_(a: LocalAccount) -> Contracts:
        return d.bind(w3, TxSender(w3, a))

    model = hashlib.sha256(b"worst m").digest()
    fps = [hashlib.sha256(b"worst f%d" % k).digest() for k in range(decl)]
    as_(gov).config.approve(Kind.MODEL, model)
    for fp in fps:
        as_(gov).config.approve(Kind.ENGINE_FINGERPRINT, fp)
    as_(gov).config.register_key_epoch(1, b"\x04" * 32, b"\x00" * 32, 2, 3)
    as_(op).stakes.register(Role.OPERATOR, 2 * ETHER)
    for i in range(n):
        acct = Account.from_key(hashlib.sha256(b"worst verifier %d" % i).digest())
        w3.provider.make_request("anvil_setBalance",  # type: ignore[arg-type]
                                 [acct.address, hex(ETHER)])
        as_(acct).stakes.register(Role.VERIFIER, params.min_verifier_stake)
        for fp in fps:
            as_(acct).stakes.declare_fingerprint(fp, model)
    increase_time(w3, d.bind(w3).stakes.coverage_notice())
    domain = Domain(chain_id=d.chain_id, verifying_contract=d.challenge_manager)
    now = int(w3.eth.get_block("latest")["timestamp"])
    receipts = [Receipt(operator=op.address, chain_id=d.chain_id, model_id=model,
                        engine_fingerprint_hash=fps[0],
                        req_hash=hashlib.sha256(b"wr%d" % i).digest(),
                        out_hash=hashlib.sha256(b"wo%d" % i).digest(), key_epoch=1,
                        ciphertext_hash=hashlib.sha256(b"wc%d" % i).digest(), issued_at=now)
                for i in range(2)]
    tree = build_tree([r.digest(domain) for r in receipts])
    as_(op).batches.commit_batch(tree.root, 2, "da://local/0x" + "00" * 32)
    proof = tree.proof(0)
    cm = as_(challenger).challenges
    cid = cm.open_challenge(receipts[0], sign_receipt_typed(receipts[0], domain, op), tree.root,
                            proof.index, proof.siblings, params.challenge_bond)
    mine(w3, params.draw_delay_blocks + 1)
    cm.draw_committee(cid)
    members = len(cm.committee(cid))
    if members != n:
        raise RuntimeError(f"resolve_gas_worst: committee of {members}, want {n}")
    increase_time(w3, params.commit_period + params.reveal_period + 1)
    resolved = cm.resolve(cid)
    return int(resolved["gasUsed"]), n, decl


def main(many_verifiers: int = MANY_VERIFIERS) -> dict[str, object]:
    t0 = time.perf_counter()
    with Anvil() as node:
        w3 = node.web3()
        gov, op, challenger, *verifiers = dev_accounts(6)
        params = default_params()
        d = deploy_all(w3, gov, params)

        def as_(a):  # type: ignore[no-untyped-def]
            return d.bind(w3, TxSender(w3, a))

        model, fp = hashlib.sha256(b"m").digest(), hashlib.sha256(b"f").digest()
        as_(gov).config.approve(Kind.MODEL, model)
        as_(gov).config.approve(Kind.ENGINE_FINGERPRINT, fp)
        as_(gov).config.register_key_epoch(1, b"\x04" * 32, b"\x00" * 32, 2, 3)
        as_(op).stakes.register(Role.OPERATOR, 2 * ETHER)
        for v in verifiers:
            as_(v).stakes.register(Role.VERIFIER, ETHER)
            as_(v).stakes.declare_fingerprint(fp, model)
        # receipts rely on the coverage coverageNotice before their issuedAt
        increase_time(w3, d.bind(w3).stakes.coverage_notice())
        domain = Domain(chain_id=d.chain_id, verifying_contract=d.challenge_manager)
        now = int(w3.eth.get_block("latest")["timestamp"])
        receipts = [Receipt(operator=op.address, chain_id=d.chain_id, model_id=model,
                            engine_fingerprint_hash=fp,
                            req_hash=hashlib.sha256(b"r%d" % i).digest(),
                            out_hash=hashlib.sha256(b"o%d" % i).digest(), key_epoch=1,
                            ciphertext_hash=hashlib.sha256(b"c%d" % i).digest(), issued_at=now)
                    for i in range(LEAVES)]
        tree = build_tree([r.digest(domain) for r in receipts])
        pointer = "da://local/0x" + hashlib.sha256(b"manifest").hexdigest()
        commit = as_(op).batches.commit_batch(tree.root, LEAVES, pointer)
        idx = 777
        proof = tree.proof(idx)
        sig = sign_receipt_typed(receipts[idx], domain, op)
        cm = as_(challenger).challenges
        before = w3.eth.block_number
        cid = cm.open_challenge(receipts[idx], sig, tree.root, proof.index, proof.siblings,
                                params.challenge_bond)
        open_first = w3.eth.get_block(before + 1)["gasUsed"]
        # Steady state: a second challenge while one is live (challenge counter and the
        # operator's lock slot are already non-zero, as on any chain past its first dispute).
        idx2 = 5
        p2 = tree.proof(idx2)
        before = w3.eth.block_number
        cm.open_challenge(receipts[idx2], sign_receipt_typed(receipts[idx2], domain, op),
                          tree.root, p2.index, p2.siblings, params.challenge_bond)
        open_gas = w3.eth.get_block(before + 1)["gasUsed"]
        mine(w3, params.draw_delay_blocks + 1)
        draw = cm.draw_committee(cid)
        member = cm.committee(cid)[0].account
        signer = next(v for v in verifiers if v.address == member)
        out = receipts[idx].out_hash
        salt = b"\x07" * 32
        cv = as_(signer).challenges.commit_vote(cid, vote_commitment(cid, member, out, salt))
        # Everyone else commits too so that the reveal opens at once.
        for m in cm.committee(cid)[1:]:
            s = next(v for v in verifiers if v.address == m.account)
            as_(s).challenges.commit_vote(cid, vote_commitment(cid, m.account, out, salt))
        rv = as_(signer).challenges.reveal_vote(cid, out, salt)
        # A declared verifier adds stake: its weight moves in every pool it is in (and in the
        # fingerprint's coverage).
        bond = as_(verifiers[-1]).stakes.bond(ETHER)
        # The same draw with 1,000 more verifiers registered.
        register_worst, declare_worst = _register_many(w3, d, many_verifiers,
                                                       params.min_verifier_stake, fp, model)
        n_verifiers = d.bind(w3).stakes.verifier_count()
        idx3 = 9
        p3 = tree.proof(idx3)
        cid3 = cm.open_challenge(receipts[idx3], sign_receipt_typed(receipts[idx3], domain, op),
                                 tree.root, p3.index, p3.siblings, params.challenge_bond)
        mine(w3, params.draw_delay_blocks + 1)
        draw_many = cm.draw_committee(cid3)
        resolve_worst, worst_committee, worst_decl = _resolve_worst(w3, gov, op, challenger)
    commit_gas = int(commit["gasUsed"])
    return {
        "commit_batch_gas": commit_gas,
        "open_challenge_gas": int(open_gas),
        "open_challenge_gas_first": int(open_first),
        "draw_committee_gas": int(draw["gasUsed"]),
        "draw_gas_1000_verifiers": int(draw_many["gasUsed"]),
        "verifiers_for_draw_1000": n_verifiers,
        "register_verifier_gas_max": register_worst,
        "declare_fingerprint_gas_max": declare_worst,
        "bond_declared_verifier_gas": int(bond["gasUsed"]),
        "commit_vote_gas": int(cv["gasUsed"]),
        "reveal_vote_gas": int(rv["gasUsed"]),
        "resolve_gas_worst": resolve_worst,
        "resolve_worst_committee": worst_committee,
        "resolve_worst_declarations": worst_decl,
        "gas_per_receipt_1024": round(commit_gas / LEAVES, 2),
        "batch_leaves": LEAVES,
        "proof_siblings": len(proof.siblings),
        "verifiers": len(verifiers),
        "committee_size": params.committee_size,
        # open: 250k until fingerprint pools (session 7): +22k for the stored fingerprint the
        # draw needs, +5k for the coverage read; the soundness fix is worth 2% (docs/contracts.md)
        "targets": {"commit_batch_gas": 60000, "open_challenge_gas": 260000,
                    "commit_vote_gas": 70000, "reveal_vote_gas": 70000,
                    "gas_per_receipt_1024": 100, "draw_gas_1000_verifiers": 500000,
                    "resolve_gas_worst": 15000000},
        "seconds": round(time.perf_counter() - t0, 2),
    }


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true", help="CI smoke run: 20 extra verifiers")
    print(json.dumps(main(SMOKE_VERIFIERS if ap.parse_args().smoke else MANY_VERIFIERS)))
