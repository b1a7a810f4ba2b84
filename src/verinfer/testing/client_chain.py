"""A chain for the verified client's tests and bench: anvil with the contracts, one staked
operator, key epoch 1 live, and ``approve`` for a (model, fingerprint) pair — governance
approves both and a verifier declares the pool, so receipts of it are valid on chain.

Coverage is read at issuedAt itself (``coverage_notice_s=0``): an answer signed right after
the declaration is covered."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from eth_account.signers.local import LocalAccount

from verinfer.chain.anvil import Anvil, dev_accounts
from verinfer.chain.bindings import Contracts, TxSender
from verinfer.chain.deploy import Deployment, deploy_all
from verinfer.chain.structs import Kind, Role, default_params
from verinfer.receipts.eip712 import Domain

#: dev account 2 operates, 3 verifies (account 1 governs), as in the operator's chain tests
OPERATOR_STAKE_ETH = 5


@dataclass
class ClientChain:
    node: Anvil
    deployment: Deployment
    deployment_file: Path
    operator: LocalAccount
    declared: set[tuple[bytes, bytes]] = field(default_factory=set)

    @property
    def domain(self) -> Domain:
        return Domain(self.deployment.chain_id, self.deployment.challenge_manager)

    def bound(self, account: LocalAccount) -> Contracts:
        w3 = self.node.web3()
        return self.deployment.bind(w3, TxSender(w3, account))

    def approve(self, model_id: bytes, fingerprint_hash: bytes) -> None:
        """Governance approves the model and the fingerprint; the verifier declares the pool."""
        if (model_id, fingerprint_hash) in self.declared:
            return
        gov = self.bound(dev_accounts(1)[0])
        for kind, item in ((Kind.MODEL, model_id), (Kind.ENGINE_FINGERPRINT, fingerprint_hash)):
            if not gov.config.is_approved(kind, item):
                gov.config.approve(kind, item)
        account = dev_accounts(3)[2]
        verifier = self.bound(account)
        if not verifier.stakes.is_verifier(account.address):
            verifier.stakes.register(Role.VERIFIER, gov.config.params().min_verifier_stake)
        verifier.stakes.declare_fingerprint(fingerprint_hash, model_id)
        self.declared.add((model_id, fingerprint_hash))

    def revoke_model(self, model_id: bytes) -> None:
        self.bound(dev_accounts(1)[0]).config.revoke(Kind.MODEL, model_id)


@contextmanager
def client_chain(directory: Path) -> Iterator[ClientChain]:
    """Anvil, the contracts (deployment.json in ``directory``), the operator staked and key
    epoch 1 registered."""
    with Anvil() as node:
        w3 = node.web3()
        gov = dev_accounts(1)[0]
        dep = deploy_all(w3, gov, default_params(), coverage_notice_s=0,
                         governance_notice_s=0)
        path = directory / "deployment.json"
        dep.save(path)
        chain = ClientChain(node, dep, path, dev_accounts(2)[1])
        chain.bound(chain.operator).stakes.register(Role.OPERATOR,
                                                    OPERATOR_STAKE_ETH * 10**18)
        chain.bound(gov).config.register_key_epoch(1, b"\x01" * 32, b"\x00" * 32, 1, 1)
        yield chain
