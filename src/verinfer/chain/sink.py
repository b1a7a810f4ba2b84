"""The on-chain batch sink: the outbox publisher hands a finished batch here and it becomes a
BatchRegistry commitment (root, leaf count, manifest DA pointer), which starts the receipts'
challenge window.

Idempotent by root: a batch the registry already holds for this operator (e.g. committed just
before a crash) is not sent again, so a publisher that retries never double-commits.
"""

from __future__ import annotations

from pathlib import Path

from eth_account import Account

from verinfer.chain.bindings import BatchRegistryContract, TxSender
from verinfer.chain.deploy import Deployment
from verinfer.chain.rpc import bounded_web3
from verinfer.da_client.sinks import BatchCommitment


class ChainBatchSink:
    def __init__(self, registry: BatchRegistryContract, operator: str) -> None:
        self.registry, self.operator = registry, operator

    @classmethod
    def connect(cls, rpc_url: str, deployment: Path, *, private_key: bytes) -> ChainBatchSink:
        """The BatchRegistry of ``deployment`` (a deployment.json) over ``rpc_url``, committing
        as the account of ``private_key``."""
        w3 = bounded_web3(rpc_url)
        dep = Deployment.load(deployment)
        account = Account.from_key(private_key)
        registry = BatchRegistryContract(w3, dep.batch_registry, TxSender(w3, account))
        return cls(registry, str(account.address))

    def commit(self, batch: BatchCommitment) -> None:
        if self.registry.batch_of(self.operator, batch.root).exists:
            return  # INVARIANT: one commitment per (operator, root), even across crashes
        self.registry.commit_batch(batch.root, batch.leaf_count, str(batch.manifest))
