"""Attack on the receipt keeper: terms read once, used forever.

The keeper read ProtocolConfig's parameters (the challenge bond, the publication deadline, the
windows) on its first step and kept them for as long as it ran. Governance changes them
(``setParams``: the bond any time; the deadlines and windows may only grow). After a change:

* a new ``challengeBond``: every claim the keeper sends pays the old one, ``claimUnpublished``
  reverts (WrongBond) and is retried with the same value until the claim window closes — an
  operator that withholds receipts meanwhile is never claimed against by a running keeper;
* a longer ``publicationDeadline``: the keeper claims a receipt whose batch was committed after
  the old deadline but within the contract's (the claim's ``publishBy`` is read at claim time),
  the operator answers with its proof and takes the bond; and it marks ``late``, ``final`` by
  windows that are no longer the chain's.

Here (anvil, the contracts, a staked operator): a receipt its operator signed and never
published; the keeper's first step sees it pending; governance doubles the bond; past the
deadline the keeper must file the claim with the bond the chain asks for now. And a receipt
available on DA is final only once the challenge window the chain has now (the contract reads
it when a challenge opens) has closed, not the one it had when the receipt became available."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from verinfer.chain.anvil import dev_accounts, increase_time
from verinfer.chain.structs import ClaimStatus
from verinfer.client import Keeper, KeeperPolicy, ReceiptStore, State
from verinfer.client.keeper import Observation, Terms, decide
from verinfer.client.receipt_store import Kept
from verinfer.da_client.local import LocalDAClient
from verinfer.protocol.hexutil import to_hex
from verinfer.receipts.eip712 import Domain, Receipt, ReceiptSigner
from verinfer.receipts.signed import SignedReceipt
from verinfer.testing.client_chain import ClientChain, client_chain


@pytest.fixture()
def chain(tmp_path: Path) -> Iterator[ClientChain]:
    with client_chain(tmp_path) as c:
        yield c


def _chain_time(chain: ClientChain) -> int:
    return int(chain.node.web3().eth.get_block("latest")["timestamp"])


@pytest.mark.anvil
def test_keeper_claims_with_the_bond_governance_set_after_it_started(
        chain: ClientChain, tmp_path: Path) -> None:
    operator = ReceiptSigner(bytes(chain.operator.key))
    h = [hashlib.sha256(f"withheld:{k}".encode()).digest() for k in range(5)]
    receipt = Receipt(operator=operator.address, chain_id=chain.deployment.chain_id,
                      model_id=h[0], engine_fingerprint_hash=h[1], req_hash=h[2],
                      out_hash=h[3], key_epoch=1, ciphertext_hash=h[4],
                      issued_at=_chain_time(chain))
    store = ReceiptStore(tmp_path / "receipts.sqlite")
    claimant = dev_accounts(5)[4]
    keeper = Keeper(store, chain.node.web3(), chain.deployment, chain.bound(claimant),
                    LocalDAClient(tmp_path / "da"), policy=KeeperPolicy(poll_s=0.2))
    keeper.track([SignedReceipt.sign(receipt, chain.domain, operator)])
    keeper.step()
    [k] = store.receipts()
    assert k.state is State.PENDING

    gov = chain.bound(dev_accounts(1)[0]).config
    params = gov.params()
    gov.set_params(replace(params, challenge_bond=params.challenge_bond * 2))
    increase_time(chain.node.web3(), (k.publish_by or 0) - _chain_time(chain) + 1)
    keeper.step()

    k = store.get(k.id)
    assert k.state is State.CLAIMED, (k.state, k.last_error)
    claim = chain.bound(claimant).challenges.claim(k.claim_id or 0)
    assert claim.status is ClaimStatus.OPEN and claim.claimant == claimant.address
    store.close()


def test_keeper_final_by_a_challenge_window_governance_lengthened() -> None:
    operator = ReceiptSigner(hashlib.sha256(b"stale window operator").digest())
    h = [hashlib.sha256(f"window:{k}".encode()).digest() for k in range(5)]
    t0 = 1_800_000_000
    s = SignedReceipt.sign(Receipt(operator=operator.address, chain_id=31337, model_id=h[0],
                                   engine_fingerprint_hash=h[1], req_hash=h[2], out_hash=h[3],
                                   key_epoch=1, ciphertext_hash=h[4], issued_at=t0),
                           Domain(31337, "0x" + "11" * 20), operator)
    committed = t0 + 100
    then = Terms(publication_deadline=600, challenge_window=3600, claim_window=3600,
                 da_grace_s=300)
    available = replace(Kept(to_hex(s.digest), s, State.PENDING), state=State.AVAILABLE,
                        committed_at=committed, final_after=committed + 3600)
    now = replace(then, challenge_window=7200)  # setParams lengthened the window
    d = decide(available, committed + 3601, now, Observation(), can_claim=True)
    assert d.action == "wait" and d.kept.state is State.AVAILABLE  # still challengeable
    d = decide(available, committed + 7201, now, Observation(), can_claim=True)
    assert d.kept.state is State.FINAL
