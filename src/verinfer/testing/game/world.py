"""The game's world: one anvil with the real contracts, the parties and their keys, the honest
parties' software, and the episode reset (anvil snapshot / revert).

Parties (docs/game.md has the action table):

- ``gov``: governance (the deployer; owner of ProtocolConfig and StakeRegistry).
- ``honest_op``: an honest operator running the operator's own pipeline: signs with its
  ``ReceiptSigner``, enqueues in its ``Outbox``, and its ``Publisher`` (stepped with
  ``run_once``) puts the ciphertexts and the manifest on DA (``LocalDAClient``) and commits
  through ``ChainBatchSink``; its ``ClaimResponder`` (stepped) answers unpublished claims.
- ``cheat_op``: an attacker-controlled operator (wrong outputs, unpublished, late, future-dated
  receipts).
- honest verifiers: each a real ``VerifierNode`` driven by ``step()``; its judge is the
  engine's truth (``true_out``) read through the real DA (see "known limits" in docs/game.md).
- sybils: attacker-controlled verifiers (any stake, any vote, any timing).
- ``challenger``: an honest challenger (the verifier package's ``Challenger``) that disputes
  every fraud it is shown; it is also the keeper that draws and resolves disputes whose
  deadlines passed.
- ``anyone``: an attacker-controlled account with no role.
"""

from __future__ import annotations

import functools
import hashlib
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from eth_account import Account
from eth_account.signers.local import LocalAccount
from eth_utils import keccak
from web3 import Web3

from verinfer.chain.anvil import dev_accounts
from verinfer.chain.bindings import Contracts, TxSender
from verinfer.chain.deploy import Deployment, deploy_all
from verinfer.chain.sink import ChainBatchSink
from verinfer.chain.structs import (
    COVERAGE_NOTICE,
    ETHER,
    INVALID_EVIDENCE,
    Kind,
    Params,
    Role,
    default_params,
)
from verinfer.da_client.errors import BlobNotFoundError
from verinfer.da_client.local import LocalDAClient
from verinfer.da_client.manifest import ManifestEntry, build_manifest, inclusion_proof
from verinfer.da_client.outbox import Outbox
from verinfer.da_client.pointer import Pointer
from verinfer.da_client.publisher import Backoff, Publisher
from verinfer.operator.claims import ClaimResponder
from verinfer.receipts.eip712 import Domain, Receipt, ReceiptSigner
from verinfer.receipts.merkle import MerkleProof, build_tree
from verinfer.receipts.signed import SignedReceipt
from verinfer.testing.chain_clock import MiningNode
from verinfer.testing.game.rpc import GameAnvil, Rpc, abi_functions
from verinfer.verifier.chain_view import ChainView
from verinfer.verifier.errors import LocalFault
from verinfer.verifier.node import NodeConfig, VerifierNode
from verinfer.verifier.votes import Verdict

MODEL = hashlib.sha256(b"verinfer.game.model").digest()
FINGERPRINT = hashlib.sha256(b"verinfer.game.fingerprint").digest()
KEY_EPOCH = 1
FUNDS = 10_000 * ETHER
CONTRACTS = ("ProtocolConfig", "StakeRegistry", "BatchRegistry", "ChallengeManager", "AuditLog")


def _note(log: list[str], who: str, msg: str) -> None:
    log.append(f"{who}: {msg}")


def true_out(req_hash: bytes) -> bytes:
    """The engine's output hash for a request: what every honest re-execution reproduces (the
    engine contract of docs/architecture.md). A receipt with another outHash is a fraud."""
    return keccak(b"verinfer.game.out" + req_hash)


def _key(label: str) -> LocalAccount:
    return Account.from_key(keccak(b"verinfer.game.key." + label.encode()))


@dataclass
class Issued:
    """A receipt made in the game, and what its operator did with it."""

    signed: SignedReceipt
    blob: bytes
    pointer: Pointer
    by: str  # "honest_op" | "cheat_op"
    fraud: bool  # outHash is not true_out(reqHash), or the receipt is invalid on its face
    root: bytes | None = None
    proof: MerkleProof | None = None
    committed_at: int | None = None

    @property
    def digest(self) -> bytes:
        return self.signed.digest

    @property
    def receipt(self) -> Receipt:
        return self.signed.receipt


class OracleJudge:
    """An honest member's verdict: the ciphertext is read from DA (absent or not matching the
    receipt's ciphertextHash is INVALID_EVIDENCE, as the enclave judge decides without a key),
    the output is the engine's truth (``true_out``)."""

    def __init__(self, da: LocalDAClient) -> None:
        self.da = da

    def __call__(self, receipt: Receipt, pointer: str | None, *, purpose: str,
                 challenge_id: str, absent_is_fault: bool = True) -> Verdict:
        try:
            blob = self.da.get(Pointer.parse(pointer or ""))
        except BlobNotFoundError as e:
            if absent_is_fault:
                return Verdict(INVALID_EVIDENCE, "ciphertext_unavailable", receipt.out_hash)
            raise LocalFault(f"ciphertext not on DA yet: {e.message}") from e
        if hashlib.sha256(blob).digest() != receipt.ciphertext_hash:
            return Verdict(INVALID_EVIDENCE, "ciphertext_hash_mismatch", receipt.out_hash)
        truth = true_out(receipt.req_hash)
        return Verdict(truth, "match" if truth == receipt.out_hash else "output_mismatch",
                       receipt.out_hash)


@dataclass
class Episode:
    """What one episode's parties know off chain (reset with the chain)."""

    tmp: Path
    da: LocalDAClient
    nodes: list[VerifierNode]
    view: ChainView
    outbox: Outbox
    publisher: Publisher
    responder: ClaimResponder
    issued: dict[bytes, Issued] = field(default_factory=dict)  # by digest
    pending: dict[str, list[Issued]] = field(default_factory=dict)  # cheater's uncommitted
    hc_challenges: dict[int, bytes] = field(default_factory=dict)  # honest challenger's
    hc_claims: dict[int, bytes] = field(default_factory=dict)
    node_log: list[str] = field(default_factory=list)
    salt_counter: int = 0
    req_counter: int = 0


class World:
    """The chain, the parties and the honest software; ``reset()`` starts a fresh episode."""

    def __init__(self, *, honest_verifiers: int = 3, sybils: int = 3,
                 params: Params | None = None, log: Callable[[str], None] = lambda s: None
                 ) -> None:
        self.log = log
        self.anvil = GameAnvil().start()
        try:
            self._setup(honest_verifiers, sybils, params or default_params())
        except BaseException:
            self.anvil.stop()
            raise
        self.ep: Episode | None = None

    # ---- setup (once per process) -------------------------------------------------------

    def _setup(self, n_honest: int, n_sybils: int, params: Params) -> None:
        self.w3: Web3 = self.anvil.web3()
        # the validation middleware asks the node for its chain id before every request;
        # the game's chain id never changes (it halves the honest parties' RPC traffic)
        self.w3.middleware_onion.remove("validation")
        self.w3.middleware_onion.remove("ens_name_to_address")
        self._bound: dict[str, Contracts] = {}
        self.rpc = Rpc(self.anvil.url)
        self.gov = dev_accounts(1)[0]
        self.honest_op = _key("honest_op")
        self.cheat_op = _key("cheat_op")
        self.challenger = _key("challenger")
        self.anyone = _key("anyone")
        self.honest_verifiers = [_key(f"verifier{i}") for i in range(n_honest)]
        self.sybils = [_key(f"sybil{i}") for i in range(n_sybils)]
        everyone = [self.gov, self.honest_op, self.cheat_op, self.challenger, self.anyone,
                    *self.honest_verifiers, *self.sybils]
        # blocks one second apart whatever the wall clock (evm_increaseTime is then ignored:
        # time moves by evm_setNextBlockTimestamp), so runs repeat from their seed
        self.rpc.batch([("anvil_setBalance", [a.address, hex(FUNDS)]) for a in everyone]
                       + [("anvil_autoImpersonateAccount", [True]),
                          ("anvil_setBlockTimestampInterval", [1])])
        self.d: Deployment = deploy_all(self.w3, self.gov, params)
        self.addr = {"ProtocolConfig": self.d.protocol_config,
                     "StakeRegistry": self.d.stake_registry,
                     "BatchRegistry": self.d.batch_registry,
                     "ChallengeManager": self.d.challenge_manager, "AuditLog": self.d.audit_log}
        self.domain = Domain(self.d.chain_id, self.d.challenge_manager)
        self.signer = ReceiptSigner(bytes(self.honest_op.key))
        self.cheat_signer = ReceiptSigner(bytes(self.cheat_op.key))
        self.tx("gov", "ProtocolConfig", "approve", [Kind.MODEL, MODEL])
        self.tx("gov", "ProtocolConfig", "approve", [Kind.ENGINE_FINGERPRINT, FINGERPRINT])
        self.tx("gov", "ProtocolConfig", "registerKeyEpoch",
                [KEY_EPOCH, b"\x04" * 65, b"\x11" * 32, 2, 3])
        for who in ("honest_op", "cheat_op"):
            self.tx(who, "StakeRegistry", "register", [Role.OPERATOR], value=3 * ETHER)
        for i in range(n_honest):
            self.tx(f"verifier{i}", "StakeRegistry", "register", [Role.VERIFIER], value=ETHER)
            self.tx(f"verifier{i}", "StakeRegistry", "declareFingerprint", [FINGERPRINT, MODEL])
        for i in range(n_sybils):
            self.tx(f"sybil{i}", "StakeRegistry", "register", [Role.VERIFIER],
                    value=params.min_verifier_stake)
            self.tx(f"sybil{i}", "StakeRegistry", "declareFingerprint", [FINGERPRINT, MODEL])
        self.jump(COVERAGE_NOTICE + 1)
        self.coinbase = self.rpc.req("eth_getBlockByNumber", ["latest", False])["miner"]
        self.snapshot = self.rpc.req("evm_snapshot", [])

    def account(self, name: str) -> LocalAccount:
        if name.startswith("verifier"):
            return self.honest_verifiers[int(name[8:])]
        if name.startswith("sybil"):
            return self.sybils[int(name[5:])]
        acct: LocalAccount = getattr(self, name)
        return acct

    def address(self, name: str) -> str:
        return str(self.account(name).address)

    @property
    def party_names(self) -> list[str]:
        return (["gov", "honest_op", "cheat_op", "challenger", "anyone"]
                + [f"verifier{i}" for i in range(len(self.honest_verifiers))]
                + [f"sybil{i}" for i in range(len(self.sybils))])

    @property
    def attacker_names(self) -> list[str]:
        return ["cheat_op", "anyone"] + [f"sybil{i}" for i in range(len(self.sybils))]

    def tx(self, who: str, contract: str, fn: str, args: list[Any], value: int = 0
           ) -> dict[str, Any]:
        f = abi_functions(contract)[fn]
        return self.rpc.send(self.address(who), self.addr[contract], f.encode(args), value)

    def view(self, contract: str, fn: str, args: list[Any] | None = None) -> tuple[Any, ...]:
        f = abi_functions(contract)[fn]
        raw = self.rpc.req(*Rpc.call_req(self.addr[contract], f, args or []))
        return f.decode(bytes.fromhex(raw[2:]))

    def contracts_for(self, acct: LocalAccount) -> Contracts:
        """The bindings an honest party sends through (made once per account)."""
        got = self._bound.get(acct.address)
        if got is None:
            got = self._bound[acct.address] = self.d.bind(self.w3, TxSender(self.w3, acct))
        return got

    def jump(self, seconds: int) -> None:
        """Mines one block ``seconds`` after the latest."""
        _, ts = self.head()
        self.rpc.batch([("evm_setNextBlockTimestamp", [ts + seconds]), ("evm_mine", [])])

    def head(self) -> tuple[int, int]:
        b = self.rpc.req("eth_getBlockByNumber", ["latest", False])
        return int(b["number"], 16), int(b["timestamp"], 16)

    # ---- episodes -----------------------------------------------------------------------

    def reset(self) -> Episode:
        """Back to the state right after setup (anvil revert), with fresh off-chain parties."""
        if self.ep is not None:
            self._close_episode()
            if not self.rpc.req("evm_revert", [self.snapshot]):
                raise RuntimeError("anvil could not revert to the game's snapshot")
            self.snapshot = self.rpc.req("evm_snapshot", [])
        shm = Path("/dev/shm")
        tmp = Path(tempfile.mkdtemp(prefix="verinfer-game-", dir=shm if shm.is_dir() else None))
        da = LocalDAClient(tmp / "da")
        view_c = self.d.bind(self.w3)
        view = ChainView(self.w3, self.d, view_c)
        op = self.contracts_for(self.honest_op)
        outbox = Outbox(tmp / "outbox.sqlite", unsafe_synchronous_normal=True)
        sink = ChainBatchSink(op.batches, self.honest_op.address)
        publisher = Publisher(outbox, da, sink, put_workers=1, rng=lambda: 0.5)
        responder = ClaimResponder(self.w3, op.challenges, op.batches, outbox,
                                   tmp / "claims.json", self.head()[0],
                                   backoff=Backoff(base_s=0.0, max_s=0.0), rng=lambda: 0.5)
        ep = Episode(tmp=tmp, da=da, nodes=[], view=view, outbox=outbox, publisher=publisher,
                     responder=responder)
        judge = OracleJudge(da)
        for i, acct in enumerate(self.honest_verifiers):
            def salt(i: int = i) -> bytes:
                ep.salt_counter += 1
                return keccak(b"verinfer.game.salt.%d.%d" % (i, ep.salt_counter))
            node = MiningNode(ChainView(self.w3, self.d, view_c), self.contracts_for(acct),
                              acct, judge, da,
                              NodeConfig(state_file=tmp / f"node{i}.json",
                                         retry_initial_s=0.0, retry_max_s=0.0),
                              salt=salt, log=functools.partial(_note, ep.node_log, f"v{i}"))
            ep.nodes.append(node)
        self.ep = ep
        return ep

    def _close_episode(self) -> None:
        assert self.ep is not None
        self.ep.publisher.close()
        self.ep.outbox.close()
        self.ep.da.close()
        shutil.rmtree(self.ep.tmp, ignore_errors=True)
        self.ep = None

    def close(self) -> None:
        if self.ep is not None:
            self._close_episode()
        self.rpc.close()
        self.anvil.stop()

    # ---- receipts -----------------------------------------------------------------------

    def make_receipt(self, by: str, *, out: bytes | None = None, issued_at: int,
                     model: bytes = MODEL, fingerprint: bytes = FINGERPRINT,
                     key_epoch: int = KEY_EPOCH, blob_ok: bool = True) -> Issued:
        """A signed receipt of ``by`` for a fresh request; ``out`` None = the true output."""
        assert self.ep is not None
        self.ep.req_counter += 1
        req = keccak(b"verinfer.game.req.%d" % self.ep.req_counter)
        truth = true_out(req)
        claimed = truth if out is None else out
        blob = b"verinfer.game.ct" + req + claimed
        ct_hash = hashlib.sha256(blob if blob_ok else blob + b"?").digest()
        r = Receipt(operator=self.address(by), chain_id=self.d.chain_id, model_id=model,
                    engine_fingerprint_hash=fingerprint, req_hash=req, out_hash=claimed,
                    key_epoch=key_epoch, ciphertext_hash=ct_hash, issued_at=issued_at)
        signer = self.signer if by == "honest_op" else self.cheat_signer
        signed = SignedReceipt.sign(r, self.domain, signer)
        fraud = (claimed != truth or not blob_ok or model != MODEL or fingerprint != FINGERPRINT
                 or key_epoch != KEY_EPOCH)
        it = Issued(signed, blob, Pointer.for_blob("local", blob), by, fraud)
        self.ep.issued[it.digest] = it
        return it

    def publish(self, items: list[Issued], *, blobs: bool = True, manifest: bool = True
                ) -> tuple[bytes, Pointer]:
        """Puts the ciphertexts and the manifest of a batch on DA (as the operator's publisher
        does); returns the root and the manifest pointer."""
        assert self.ep is not None
        m = build_manifest([ManifestEntry(i.signed, i.pointer) for i in items])
        data = m.to_bytes()
        if blobs:
            self.ep.da.put_many([i.blob for i in items])
        ptr = self.ep.da.put(data) if manifest else Pointer.for_blob("local", data)
        tree = build_tree(m.digests)
        for k, i in enumerate(items):
            i.root, i.proof = m.root, tree.proof(k)
        return m.root, ptr

    def honest_commit(self, items: list[Issued]) -> None:
        """The honest operator's path for signed receipts: the outbox, then one publisher
        step (DA, manifest, commit through the chain sink)."""
        ep = self.ep
        assert ep is not None
        ep.outbox.enqueue_many([(i.digest, i.signed.to_bytes(), i.blob) for i in items])
        ep.publisher.run_once(flush=True)
        for i in items:
            found = ep.outbox.entry_state(i.digest)
            row = None if found is None or found[2] is None else ep.outbox.batch(found[2])
            if row is None or row.state != "committed":
                continue  # the publisher retries it on a later step (docs/da.md)
            i.root, i.proof = row.root, inclusion_proof(row.manifest, i.digest)
            b = self.view("BatchRegistry", "batchOf", [self.address("honest_op"), row.root])[0]
            i.committed_at = int(b[1])
