"""``ChainCommitteeOracle``: the shards' CommitteeOracle read from the deployed contracts.

A shard decides who may receive a key share from the chain itself, never from a file that a
requester could write (docs/kms.md §3, "Committee oracle"). Every answer is a fresh read of
the latest block through the read-only bindings (``verinfer.chain.bindings``):

- ``is_committee_member(cid, requester)`` — full challenges. ``cid`` must be a canonical
  decimal string (``"7"``; not ``"07"``, ``"+7"``, ``" 7"`` or non-ASCII digits: another
  spelling of the same challenge would be another report_data). Two direct view calls, no
  log scan: ``ChallengeManager.vote(cid, requester).state`` is ``Member``/``Committed``/
  ``Revealed`` exactly for the accounts the draw chose (set once, in ``drawCommittee``), and
  ``ChallengeManager.challenge(cid).status`` must be ``Voting`` (drawn, not yet resolved). The
  status is read last, so a resolution mined before that read refuses.
- ``is_registered_verifier(requester)`` — light audits. ``StakeRegistry.accountOf(requester)``
  must have role ``Verifier`` and active stake (stake - unbonding) of at least
  ``ProtocolConfig.params().minVerifierStake``: an account that unbonded below the minimum
  could not be drawn for a committee and has nothing at stake behind its audits.

- ``challenge_covers(cid, receipt)`` — per-receipt decryption: ``ChallengeManager.
  challenge(cid)``'s ``receiptDigest`` must equal the receipt's EIP-712 digest under this
  deployment's domain (chain id, ChallengeManager), status ``Voting``: a member of challenge A
  gets nothing for receipt B.
- ``is_audit_assigned`` — there is no on-chain light-audit draw yet, so it is always False:
  per-receipt light audits are refused on chain rather than left to self-selection.
Nothing is cached: a resolved challenge, a retired verifier or a raised minimum take effect on
the next request. A read that fails (RPC unreachable, timeout, node error, no contract at the
address) raises ``CommitteeUnavailableError`` (HTTP 503, reason ``committee_unavailable``):
the shard refuses and says why; it never grants on an error. A malformed challenge id or
requester address is simply not a member (``False``).

Trust: the shard trusts its RPC endpoint. Run it against a node the shard's operator controls
(or several, compared); on a chain with reorgs, a committee is final once its draw is; the
devnet's anvil has none.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import requests
from web3 import Web3
from web3.providers.rpc.utils import ExceptionRetryConfiguration

from verinfer.chain.bindings import Contracts
from verinfer.chain.deploy import Deployment
from verinfer.chain.rpc import bounded_provider
from verinfer.chain.structs import Role, Status, VoteState
from verinfer.errors import VerinferError
from verinfer.httpserve import redact_url
from verinfer.kms.errors import CommitteeUnavailableError, RegistryError
from verinfer.receipts.eip712 import Domain, Receipt

T = TypeVar("T")

# uint256 has at most 78 decimal digits; larger values are rejected by the range check.
_CANONICAL_DECIMAL = re.compile(r"0|[1-9][0-9]{0,77}")
_UINT256_MAX = 2**256 - 1


def parse_challenge_id(challenge_id: str) -> int | None:
    """The on-chain id of a canonical decimal challenge id, else None."""
    if not _CANONICAL_DECIMAL.fullmatch(challenge_id):
        return None
    cid = int(challenge_id)
    return cid if cid <= _UINT256_MAX else None


def _checksum(address: str) -> str | None:
    try:
        return str(Web3.to_checksum_address(address))
    except (ValueError, TypeError):
        return None


class ChainCommitteeOracle:
    """CommitteeOracle over one deployment's ChallengeManager, StakeRegistry, ProtocolConfig."""

    def __init__(self, w3: Web3, deployment: Deployment, *, source: str = "") -> None:
        self.w3 = w3
        self.deployment = deployment
        self.contracts: Contracts = deployment.bind(w3)  # read-only: no sender
        # named by scheme, host and port only: the message goes to requesters (refusals)
        self._url = source
        self.source = redact_url(source, source) if source else "the chain"

    @classmethod
    def connect(cls, rpc_url: str, deployment: Path | Deployment, *, timeout_s: float = 3.0,
                retries: int = 1) -> ChainCommitteeOracle:
        """Bind ``deployment`` (a deployment.json path or a Deployment) on ``rpc_url``.
        ``timeout_s`` bounds each whole RPC call, retries included, and its answer holds at
        most 32 MiB (``verinfer.chain.rpc``: a node that drips its answer is cut at the
        deadline); a refused or dropped connection is retried ``retries`` times, a timeout is
        not: a dead or stuck node turns into a refusal within seconds (the enclave runner waits
        5 s per shard, and the shard's event loop waits with it). Raises DeploymentFileError
        for an unreadable deployment file."""
        d = deployment if isinstance(deployment, Deployment) else Deployment.load(deployment)
        provider = bounded_provider(
            rpc_url, deadline_s=timeout_s,
            exception_retry_configuration=ExceptionRetryConfiguration(
                errors=(requests.ConnectionError,),
                retries=retries, backoff_factor=0.05))
        return cls(Web3(provider), d, source=rpc_url)

    def _read(self, what: str, fn: Callable[[], T]) -> T:
        try:
            return fn()
        except Exception as e:  # fail closed: any failed read refuses, typed, with the cause
            detail = e.message if isinstance(e, VerinferError) else f"{type(e).__name__}: {e}"
            detail = redact_url(detail, self._url)
            raise CommitteeUnavailableError(
                f"cannot read {what} from {self.source}: {detail}"[:500]) from e

    def check(self) -> None:
        """Startup check: the node serves the deployment's chain and its contracts exist.
        Raises RegistryError on a mismatch, CommitteeUnavailableError if the node is down."""
        d = self.deployment
        chain_id = self._read("eth_chainId", lambda: int(self.w3.eth.chain_id))
        if chain_id != d.chain_id:
            raise RegistryError(f"{self.source} serves chain {chain_id}, the deployment is for "
                                f"chain {d.chain_id}")
        for name, addr in (("ChallengeManager", d.challenge_manager),
                           ("StakeRegistry", d.stake_registry),
                           ("ProtocolConfig", d.protocol_config)):
            if not self._read(f"the code of {name}", self._code_reader(addr)):
                raise RegistryError(f"no {name} contract at {addr} on {self.source}")

    def _code_reader(self, address: str) -> Callable[[], bytes]:
        return lambda: bytes(self.w3.eth.get_code(Web3.to_checksum_address(address)))

    def is_committee_member(self, challenge_id: str, requester: str) -> bool:
        cid = parse_challenge_id(challenge_id)
        who = _checksum(requester)
        if cid is None or who is None:
            return False
        cm = self.contracts.challenges
        vote = self._read(f"challenge {cid}'s vote record of {requester}",
                          lambda: cm.vote(cid, who))
        if vote.state is VoteState.NONE:
            return False
        info = self._read(f"challenge {cid}", lambda: cm.challenge(cid))
        return info.status is Status.VOTING

    def is_registered_verifier(self, requester: str) -> bool:
        who = _checksum(requester)
        if who is None:
            return False
        acct = self._read(f"the stake account of {requester}",
                          lambda: self.contracts.stakes.account_of(who))
        if acct.role is not Role.VERIFIER:
            return False
        params = self._read("the protocol parameters", lambda: self.contracts.config.params())
        return acct.stake - acct.unbonding >= params.min_verifier_stake

    def challenge_covers(self, challenge_id: str, receipt: Receipt) -> bool:
        cid = parse_challenge_id(challenge_id)
        if cid is None:
            return False
        cm = self.contracts.challenges
        info = self._read(f"challenge {cid}", lambda: cm.challenge(cid))
        domain = Domain(self.deployment.chain_id, self.deployment.challenge_manager)
        return info.status is Status.VOTING and bytes(info.receipt_digest) == \
            receipt.digest(domain)

    def is_audit_assigned(self, requester: str, receipt: Receipt) -> bool:
        # No audit schedule is published on chain yet; never let an auditor choose its own.
        return False
