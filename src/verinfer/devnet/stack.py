"""An in-process local stack for benchmarks and tests: anvil and the KMS shards run as real
processes; the verifier nodes run as threads of this process sharing one engine (the devnet
CLI runs them as separate processes instead)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from types import TracebackType

from web3 import Web3

from verinfer.chain.anvil import Anvil
from verinfer.chain.structs import ETHER, Params
from verinfer.da_client.local import LocalDAClient
from verinfer.devnet.network import (
    CODE_HASH,
    CONTAINER_DIGEST,
    bind,
    deploy_network,
    epoch_public_key,
    provision_kms,
    register_epoch,
    register_verifiers,
    roles,
)
from verinfer.engine.engine import Engine
from verinfer.kms.local_cluster import ChainSource, ShardProcesses
from verinfer.receipts.eip712 import Domain, ReceiptSigner
from verinfer.testing.chain_clock import MiningNode, TimeTravelChallenger
from verinfer.testing.evidence import EvidenceFactory
from verinfer.verifier.chain_view import ChainView
from verinfer.verifier.challenger import Challenger
from verinfer.verifier.enclave_judge import EnclaveConfig, EnclaveJudge
from verinfer.verifier.node import JudgeFn, NodeConfig


class LocalStack:
    def __init__(self, root: Path, engine: Engine, model_path: Path, params: Params, *,
                 n_verifiers: int = 4, wrap_judge: Callable[[JudgeFn], JudgeFn] | None = None,
                 log: Callable[[str], None] = lambda s: None,
                 on_timings: Callable[[dict[str, float]], None] | None = None) -> None:
        self.root, self.engine, self.model_path, self.params = root, engine, model_path, params
        self.n_verifiers, self.wrap_judge, self.log = n_verifiers, wrap_judge, log
        self.threads: list[tuple[threading.Thread, threading.Event]] = []
        self.on_timings = on_timings

    def __enter__(self) -> LocalStack:
        self.anvil = Anvil().start()
        w3 = self.w3 = self.anvil.web3()
        r = self.roles = roles(self.n_verifiers)
        self.d = deploy_network(w3, r, self.engine, self.params)
        self.d.save(self.root / "deployment.json")
        register_verifiers(w3, self.d, r, [(self.engine.fingerprint.hash, self.engine.model_id)])
        self.lay = provision_kms(self.root / "kms", self.engine)
        rec = register_epoch(w3, self.d, r, self.lay)
        self.da = LocalDAClient(self.root / "da")
        self.view = ChainView(w3, self.d, bind(w3, self.d))
        self.factory = EvidenceFactory(self.engine, ReceiptSigner(r.operator.key),
                                       Domain(self.d.chain_id, self.d.challenge_manager),
                                       key_epoch=1, epoch_public_key=epoch_public_key(rec),
                                       now=lambda: self.view.head()[1])
        cfg = EnclaveConfig(self.lay.root_key, self.lay.directory, self.lay.registry,
                            CONTAINER_DIGEST, CODE_HASH, self.model_path)
        self.shards = ShardProcesses(self.lay,
                                     chain=ChainSource(self.anvil.url,
                                                       self.root / "deployment.json"),
                                     extra_args=["--rate-capacity", "1000",
                                                 "--rate-refill", "100"])
        self.shards.start()
        self.nodes = []
        for i, acct in enumerate(r.verifiers):
            vw3 = Web3(Web3.HTTPProvider(self.anvil.url))
            c = bind(vw3, self.d, acct)
            judge: JudgeFn = EnclaveJudge(cfg, acct, self.da, self.engine,
                                          on_timings=self.on_timings).judge
            if self.wrap_judge is not None:
                judge = self.wrap_judge(judge)
            node = MiningNode(ChainView(vw3, self.d, c), c, acct, judge, self.da,
                              NodeConfig(self.root / f"verifier-{i}.json"), log=self._tagged(i))
            node.ensure_registered(ETHER)
            self.nodes.append(node)
            stop = threading.Event()
            t = threading.Thread(target=node.run, args=(stop.is_set, 0.1), daemon=True)
            t.start()
            self.threads.append((t, stop))
        return self

    def _tagged(self, i: int) -> Callable[[str], None]:
        return lambda m: self.log(f"[v{i}] {m}")

    def challenger(self) -> Challenger:
        return TimeTravelChallenger(self.view, bind(self.w3, self.d, self.roles.challenger),
                                    self.da)

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        for _, stop in self.threads:
            stop.set()
        for t, _ in self.threads:
            t.join(timeout=30)
        self.shards.stop_all()
        self.anvil.stop()
