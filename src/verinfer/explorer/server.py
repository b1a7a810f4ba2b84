"""Wires one explorer: the index, the chain follower and the prober (background threads), and
the web app over them. Used by `verinfer explorer`, the tests and bench/explorer.py."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from pathlib import Path

from fastapi import FastAPI

from verinfer.chain.deploy import Deployment
from verinfer.chain.rpc import bounded_web3
from verinfer.da_client.factory import DAConfig, DARouter, open_client
from verinfer.explorer.app import create_app
from verinfer.explorer.follower import ChainFollower
from verinfer.explorer.index import Index
from verinfer.explorer.models import ModelNames
from verinfer.explorer.probes import AuditReportReader, Prober
from verinfer.explorer.views import Context
from verinfer.receipts.eip712 import Domain


@dataclass
class ExplorerConfig:
    rpc_url: str
    deployment: Path
    da_store: Path | None = None
    da_redis_url: str | None = None
    redis_url: str | None = None  # light-audit reports stream
    audit_prefix: str = ""
    kms_urls: list[str] = field(default_factory=list)
    operator_urls: list[str] = field(default_factory=list)
    model_names: Path | None = None  # the deployment's model list (explorer/models.py)
    poll_s: float = 0.5
    probe_s: float = 3.0


class Explorer:
    def __init__(self, cfg: ExplorerConfig) -> None:
        self.cfg = cfg
        self.deployment = Deployment.load(cfg.deployment)
        self.w3 = bounded_web3(cfg.rpc_url, deadline_s=10.0)
        da_cfg = DAConfig(local_store=str(cfg.da_store) if cfg.da_store else None,
                          redis_url=cfg.da_redis_url)
        clients = [open_client(b, da_cfg) for b, on in (("local", cfg.da_store),
                                                         ("redis", cfg.da_redis_url)) if on]
        self.da = DARouter(clients) if clients else None
        self.index = Index()
        self.names = ModelNames()
        if cfg.model_names is not None:
            self.names.load_file(cfg.model_names)
        self.follower = ChainFollower(self.index, self.w3, self.deployment, self.da)
        audits = AuditReportReader(cfg.redis_url, cfg.audit_prefix) \
            if cfg.redis_url and cfg.audit_prefix else None
        self.prober = Prober(cfg.kms_urls, cfg.operator_urls, audits, interval_s=cfg.probe_s,
                             names=self.names, model_ids=self._approved_model_ids)
        da_args: list[str] = []
        if cfg.da_store:
            da_args += ["--da-store", str(cfg.da_store)]
        if cfg.da_redis_url:
            da_args += ["--da-redis-url", cfg.da_redis_url]
        self.ctx = Context(self.index, Domain(self.deployment.chain_id,
                                              self.deployment.challenge_manager),
                           self.prober, self.da, cfg.rpc_url, str(cfg.deployment),
                           tuple(da_args), self.names)
        self.app: FastAPI = create_app(self.ctx)
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    def _approved_model_ids(self) -> list[bytes]:
        with self.index.lock:
            return [ap.item for ap in self.index.approved_models()]

    def start(self) -> Explorer:
        for name, target in (("follower", lambda: self.follower.run(self._stop,
                                                                     self.cfg.poll_s)),
                             ("prober", lambda: self.prober.run(self._stop))):
            t = threading.Thread(target=target, name=f"explorer-{name}", daemon=True)
            t.start()
            self._threads.append(t)
        return self

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=10)
        if self.da is not None:
            self.da.close()
