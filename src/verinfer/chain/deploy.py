"""Deploy the contract set and (de)serialize where it lives."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from eth_account.signers.local import LocalAccount
from web3 import Web3

from verinfer.chain.bindings import (
    AuditLogContract,
    BatchRegistryContract,
    ChallengeManagerContract,
    Contracts,
    ProtocolConfigContract,
    StakeRegistryContract,
    TxSender,
)
from verinfer.chain.errors import DeploymentFileError
from verinfer.chain.structs import COVERAGE_NOTICE, GOVERNANCE_NOTICE, MIN_COVERAGE_BPS, Params


@dataclass(frozen=True)
class Deployment:
    """Addresses of one deployment; ChallengeManager is the receipts' EIP-712 verifyingContract."""

    chain_id: int
    protocol_config: str
    stake_registry: str
    batch_registry: str
    challenge_manager: str
    audit_log: str
    deployed_block: int

    def save(self, path: Path) -> None:
        path.write_text(json.dumps(asdict(self), indent=2) + "\n")

    @classmethod
    def load(cls, path: Path) -> Deployment:
        try:
            data = json.loads(path.read_text())
            return cls(**data)
        except (OSError, ValueError, TypeError) as e:
            raise DeploymentFileError(f"cannot read deployment file {path}: {e}",
                                      param="deployment") from e

    def bind(self, w3: Web3, sender: TxSender | None = None) -> Contracts:
        return Contracts(
            config=ProtocolConfigContract(w3, self.protocol_config, sender),
            stakes=StakeRegistryContract(w3, self.stake_registry, sender),
            batches=BatchRegistryContract(w3, self.batch_registry, sender),
            challenges=ChallengeManagerContract(w3, self.challenge_manager, sender),
            audits=AuditLogContract(w3, self.audit_log, sender),
        )


def deploy_all(w3: Web3, deployer: LocalAccount, params: Params,
               governance: str | None = None, *,
               coverage_notice_s: int = COVERAGE_NOTICE,
               min_coverage_bps: int = MIN_COVERAGE_BPS,
               governance_notice_s: int = GOVERNANCE_NOTICE) -> Deployment:
    """Deploys ProtocolConfig, StakeRegistry, BatchRegistry, ChallengeManager and AuditLog,
    wires the ChallengeManager into the StakeRegistry, then hands ownership to `governance`
    (default: the deployer). ``coverage_notice_s``: StakeRegistry.coverageNotice, how long
    before a receipt's issuedAt its fingerprint's coverage is read (0 only for a devnet whose
    operator signs right after its verifiers declared). ``min_coverage_bps``:
    StakeRegistry.minCoverageBps, the share of all verifier weight a fingerprint's declared
    verifiers must hold for its receipts to be valid (immutable once deployed).
    ``governance_notice_s``: ProtocolConfig.governanceNotice, how long after a revocation or a
    key epoch's retirement it takes effect (immutable)."""
    sender = TxSender(w3, deployer)
    me = sender.address
    config, first = sender.deploy("ProtocolConfig", me, params.as_tuple(), governance_notice_s)
    stakes, _ = sender.deploy("StakeRegistry", me, config, coverage_notice_s, min_coverage_bps)
    batches, _ = sender.deploy("BatchRegistry", stakes)
    cm, _ = sender.deploy("ChallengeManager", config, stakes, batches)
    audits, _ = sender.deploy("AuditLog", stakes)
    StakeRegistryContract(w3, stakes, sender).set_challenge_manager(cm)
    if governance is not None and Web3.to_checksum_address(governance) != me:
        for bound in (ProtocolConfigContract(w3, config, sender),
                      StakeRegistryContract(w3, stakes, sender)):
            sender.send(bound.contract.functions.transferOwnership(governance))
    return Deployment(chain_id=w3.eth.chain_id, protocol_config=config, stake_registry=stakes,
                      batch_registry=batches, challenge_manager=cm, audit_log=audits,
                      deployed_block=int(first["blockNumber"]))
