"""Driving a running devnet from Python (tests, the demo, benchmarks): its chain, DA store and
KMS epoch from ``<dir>/devnet.json``; challengers with their own funded accounts (one account
per concurrent challenge keeps nonces apart); the operator's key to stand in for a dishonest
operator (``unsafe_operator_factory``): anvil dev keys, local use only."""

from __future__ import annotations

import json
import os
import secrets
import signal
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from eth_account import Account
from eth_account.signers.local import LocalAccount
from web3 import Web3

from verinfer.chain.bindings import Contracts
from verinfer.chain.deploy import Deployment
from verinfer.chain.structs import ETHER, Role
from verinfer.da_client.local import LocalDAClient
from verinfer.devnet.network import bind, epoch_public_key, publish_batch, roles
from verinfer.engine.engine import Engine
from verinfer.errors import BadInputError
from verinfer.kms.epochs import FileEpochRegistry
from verinfer.receipts.eip712 import Domain, ReceiptSigner
from verinfer.testing.chain_clock import TimeTravelChallenger
from verinfer.testing.evidence import Evidence, EvidenceFactory
from verinfer.verifier.chain_view import ChainView
from verinfer.verifier.challenger import Challenger, Located, locate
from verinfer.verifier.errors import ReceiptRefError

STATE = "devnet.json"


class DevnetStateError(BadInputError):
    """No (or an unreadable) devnet.json in the given directory."""

    code = "devnet_state"


@dataclass(frozen=True)
class Payout:
    """Where a resolved challenge's money went (from its resolve transaction's events)."""

    status: int
    credited: dict[str, int]  # account -> wei credited in the resolve transaction
    slashed: int


class Devnet:
    def __init__(self, directory: Path) -> None:
        self.dir = directory.resolve()
        try:
            self.state: dict[str, Any] = json.loads((self.dir / STATE).read_text())
        except (OSError, ValueError) as e:
            raise DevnetStateError(f"no readable {self.dir / STATE}: {e}",
                                   param="dir") from e
        self.rpc_url: str = self.state["rpc_url"]
        self.w3 = Web3(Web3.HTTPProvider(self.rpc_url, request_kwargs={"timeout": 30}))
        self.deployment = Deployment.load(self.dir / "deployment.json")
        self.view = ChainView(self.w3, self.deployment, bind(self.w3, self.deployment))
        self.da = LocalDAClient(self.state["da_store"])
        self.domain = Domain(self.deployment.chain_id, self.deployment.challenge_manager)
        self.roles = roles(len(self.state["accounts"]["verifiers"]))

    @property
    def operator_url(self) -> str:
        url = self.state.get("operator_url")
        if not url:
            raise DevnetStateError("this devnet has no operator", param="operator_url")
        return str(url)

    @property
    def read(self) -> Contracts:
        return bind(self.w3, self.deployment)

    def wait_ready(self, timeout_s: float = 300.0) -> None:
        """Until every verifier process registered on chain (a committee needs them all)."""
        deadline = time.monotonic() + timeout_s
        for addr in self.state["accounts"]["verifiers"]:
            while self.read.stakes.account_of(addr).role is not Role.VERIFIER:
                if time.monotonic() > deadline:
                    raise DevnetStateError(f"verifier {addr} did not register within "
                                           f"{timeout_s}s (see {self.dir / 'logs'})",
                                           param="verifiers")
                time.sleep(0.5)

    def pid(self, name: str) -> int:
        return int(self.state["pids"][name])

    def unsafe_kill(self, name: str) -> None:
        """SIGKILLs one of the devnet's processes (e.g. ``verifier-3``) by its recorded pid."""
        os.kill(self.pid(name), signal.SIGKILL)

    # ---- accounts and challenges ---------------------------------------------------------
    def funded_account(self, eth: int = 100) -> LocalAccount:
        """A fresh account with ``eth`` ETH (anvil_setBalance)."""
        acct: LocalAccount = Account.from_key(secrets.token_bytes(32))
        self.w3.provider.make_request("anvil_setBalance",  # type: ignore[arg-type]
                                      [acct.address, hex(eth * ETHER)])
        return acct

    def challenger(self, account: LocalAccount | None = None, *,
                   stall_s: float = 30.0) -> Challenger:
        """A challenger on its own connection (one per thread), with devnet time travel."""
        w3 = Web3(Web3.HTTPProvider(self.rpc_url, request_kwargs={"timeout": 30}))
        ch = TimeTravelChallenger(ChainView(w3, self.deployment, bind(w3, self.deployment)),
                                  bind(w3, self.deployment, account or self.funded_account()),
                                  self.da)
        ch.stall_s = stall_s
        return ch

    def wait_located(self, ref: str, timeout_s: float = 60.0) -> Located:
        """Waits until the operator's publisher committed the receipt's batch."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                loc = locate(self.view, self.da, ref)
                if loc.batch is not None or time.monotonic() > deadline:
                    return loc
            except ReceiptRefError:
                if time.monotonic() > deadline:
                    raise
            time.sleep(0.5)

    def payout(self, challenge_id: int) -> Payout:
        """Status, per-account credits and slashed amount of a resolved challenge."""
        cm = self.read.challenges.contract
        resolved = cm.events.ChallengeResolved().get_logs(
            from_block=self.deployment.deployed_block, argument_filters={"id": challenge_id})
        if not resolved:
            raise DevnetStateError(f"challenge {challenge_id} is not resolved", param="id")
        ev = resolved[-1]
        tx = ev["transactionHash"]
        credited: dict[str, int] = {}
        for c in cm.events.Credited().get_logs(from_block=ev["blockNumber"],
                                               to_block=ev["blockNumber"]):
            if c["transactionHash"] == tx:
                who = str(c["args"]["account"])
                credited[who] = credited.get(who, 0) + int(c["args"]["amount"])
        return Payout(int(ev["args"]["status"]), credited, int(ev["args"]["slashed"]))

    # ---- standing in for the operator (cheats) --------------------------------------------
    def unsafe_operator_factory(self, engine: Engine,
                                now: Callable[[], float] | None = None) -> EvidenceFactory:
        """Signs receipts with the devnet operator's key and seals to the devnet's KMS epoch
        1 key: what the operator's pipeline does, for producing dishonest evidence."""
        rec = FileEpochRegistry(Path(self.state["kms"]["root"]) / "epochs.json").get(1)
        return EvidenceFactory(engine, ReceiptSigner(self.roles.operator.key), self.domain,
                               key_epoch=1, epoch_public_key=epoch_public_key(rec),
                               now=now or (lambda: self.view.head()[1]))

    def unsafe_publish_as_operator(self, evs: Sequence[Evidence],
                                   withheld: Sequence[Evidence] = ()) -> str:
        """Ciphertexts and a manifest to the devnet's DA store, the root committed on chain
        with the operator's account. Returns the manifest pointer."""
        return publish_batch(self.da, bind(self.w3, self.deployment, self.roles.operator),
                             evs, withheld)
