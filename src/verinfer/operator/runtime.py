"""Builds the evidence pipeline, the publisher and the readiness monitors from an operator
config.

Before the server signs anything it must know that every receipt it signs can be honoured:

* chain binding (issue 24.2): with a chain configured, the connected chain's id, the
  deployment's chain id and operator.json's chain id are one number, and the ChallengeManager
  there has the EIP-712 domain separator the receipts use — otherwise the server refuses to
  start (a receipt for another chain verifies off chain but can never be challenged). Every
  signature then goes through :class:`ChainBoundSigner`, which refuses a receipt whose chainId
  or domain differs.
* identity (issue 13.5): the model id and the *approved* engine fingerprint hash are on
  ProtocolConfig's allowlists; re-checked every ``identity_interval_s``.
* coverage (fingerprint pools, docs/contracts.md): a receipt whose engine fingerprint was not
  covered ``coverageNotice`` before its issuedAt (declared verifiers holding less than
  ``minCoverageBps`` of all verifier stake, or none) is invalid on its face and slashed at
  open. :class:`ChainIdentity` blocks signing while the fingerprint is uncovered now, and
  :class:`CoverageGuard` checks each receipt's own issuedAt before it is signed (exact: the
  coverage it reads lies ``coverageNotice`` in the past, so it is final).
* backlog (issue 14.7): the oldest receipt not yet committed stays well inside the publication
  deadline (on chain: ``Params.publicationDeadline``).
* unpublished claims (issue 31): with a chain, :class:`~verinfer.operator.claims.ClaimResponder`
  answers every ``claimUnpublished`` on this operator's receipts with the Merkle proof from the
  outbox, before the response deadline (an unanswered claim slashes an honest operator).

Production-unsafe modes (no chain, zero verifying contract, a KMS provisioned next to the
operator key) are listed by :func:`unsafe_reasons`; `verinfer serve` refuses them without
``--unsafe-dev`` and reports them in /health and the metrics.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from verinfer.da_client.base import DAClient
from verinfer.da_client.outbox import Outbox
from verinfer.da_client.publisher import Publisher
from verinfer.engine.engine import Engine
from verinfer.kms.epochs import FileEpochRegistry, require_live
from verinfer.operator.config import ChainSink, OperatorConfig, OperatorConfigError
from verinfer.operator.evidence import EvidencePipeline
from verinfer.operator.publication import open_da, open_sink
from verinfer.operator.readiness import BacklogMonitor, MonitorThread, NotReadyError, Readiness
from verinfer.protocol.hexutil import to_hex
from verinfer.receipts.eip712 import Domain, Receipt, ReceiptSigner
from verinfer.receipts.epoch_keys import load_public_key

if TYPE_CHECKING:
    from verinfer.operator.claims import ClaimResponder
    from verinfer.operator.committer import StreamBatchIndex

log = logging.getLogger(__name__)

ZERO_ADDRESS = "0x0000000000000000000000000000000000000000"
#: Without a chain there is no on-chain deadline; this bounds the backlog all the same.
DEFAULT_PUBLICATION_DEADLINE_S = 600.0
#: Stop signing once the oldest unpublished receipt has used this share of its deadline: the
#: rest is the margin in which the publisher drains what was signed before the stop.
DEFAULT_STOP_FRACTION = 0.5


class ChainBoundSigner(ReceiptSigner):
    """The operator key, refusing any receipt not bound to the one chain and domain it serves
    (receipt chainId = domain chainId = the connected chain's id)."""

    def __init__(self, private_key: bytes | str, domain: Domain) -> None:
        super().__init__(private_key)
        self.domain = domain

    def sign(self, receipt: Receipt, domain: Domain) -> bytes:
        if domain != self.domain or receipt.chain_id != self.domain.chain_id:
            raise OperatorSigningError(
                f"refusing to sign: receipt chainId {receipt.chain_id} / domain "
                f"{domain.to_json()} differ from the served chain {self.domain.to_json()}")
        return super().sign(receipt, domain)


class OperatorSigningError(OperatorConfigError):
    status_code = 500
    error_type = "server_error"
    code = "operator_signing"


@dataclass
class ChainIdentity:
    """Checks the operator's identity against ProtocolConfig's allowlists (a monitor)."""

    readiness: Readiness
    config: Any  # chain.bindings.ProtocolConfigContract
    model_id: bytes
    fingerprint_hash: bytes
    interval_s: float = 30.0  # re-check period while approved (revocation is rare)
    clock: Callable[[], float] = time.monotonic
    stakes: Any = None  # chain.bindings.StakeRegistryContract: also check coverage when set
    wall_clock: Callable[[], float] = time.time  # the issuedAt a receipt signed now would get
    retry_after_s: float = 30.0
    NAME: str = "identity"
    _checked_at: float | None = None

    def __call__(self) -> None:
        """Every call while blocked (approval is picked up within one monitor tick), else
        once per ``interval_s``."""
        from verinfer.chain.structs import Kind, pool_key

        now = self.clock()
        if (self._checked_at is not None and self.NAME not in self.readiness.reasons()
                and now - self._checked_at < self.interval_s):
            return
        self._checked_at = now
        problems = []
        if not self.config.is_approved(Kind.MODEL, self.model_id):
            problems.append(f"model id {to_hex(self.model_id)} is not approved on chain")
        if not self.config.is_approved(Kind.ENGINE_FINGERPRINT, self.fingerprint_hash):
            problems.append(f"engine fingerprint {to_hex(self.fingerprint_hash)} is not "
                            "approved on chain")
        elif self.stakes is not None and not self.stakes.is_covered_at(
                pool_key(self.fingerprint_hash, self.model_id), int(self.wall_clock())):
            problems.append(f"no verifier is declared for engine fingerprint "
                            f"{to_hex(self.fingerprint_hash)} and model "
                            f"{to_hex(self.model_id)} with enough stake (under "
                            "minCoverageBps of all verifier stake; coverage read "
                            "coverageNotice before now)")
        if problems:
            self.readiness.block(self.NAME, "; ".join(problems) + " (receipts would be "
                                 "slashable at challenge open)", self.retry_after_s)
        else:
            self.readiness.clear(self.NAME)


class CoverageGuard:
    """Refuses (503, :class:`NotReadyError`) to sign a receipt whose (engine fingerprint,
    model) pool was not covered at ``issuedAt - coverageNotice`` (``StakeRegistry.isCoveredAt``:
    no declared verifier, or declared stake under ``minCoverageBps`` of all verifier stake): the
    contract would find it invalid on its face and slash it at open, so signing it hands a
    challenger the stake. Exact per receipt, where the readiness monitor only samples: a
    verifier set that dips to zero for a few seconds (the last verifier undeclaring and
    re-declaring to farm challenges) is caught. The answer for a past instant never changes,
    so it is cached per (pool key, second); a failed read refuses too (fail closed)."""

    CACHE_MAX = 4096

    def __init__(self, stakes: Any, *, retry_after_s: float = 5.0) -> None:
        self.stakes, self.retry_after_s = stakes, retry_after_s
        self._lock = threading.Lock()
        self._cache: dict[tuple[bytes, int], bool] = {}

    def __call__(self, receipt: Receipt) -> None:
        from verinfer.chain.structs import pool_key  # the chain layer only where it is used

        # the pool of the receipt's (fingerprint, model): its committee is drawn from it
        key = (pool_key(receipt.engine_fingerprint_hash, receipt.model_id), receipt.issued_at)
        with self._lock:
            covered = self._cache.get(key)
        if covered is None:
            try:
                covered = bool(self.stakes.is_covered_at(*key))
            except Exception as e:  # any RPC failure: coverage unproven, so do not sign
                raise NotReadyError(f"cannot read the coverage of engine fingerprint "
                                    f"{to_hex(receipt.engine_fingerprint_hash)} model "
                                    f"{to_hex(receipt.model_id)} from the chain: {e}"[:500],
                                    retry_after=self.retry_after_s) from None
            with self._lock:
                if len(self._cache) >= self.CACHE_MAX:
                    self._cache.clear()
                self._cache[key] = covered
        if not covered:
            raise NotReadyError(f"no verifier was declared for engine fingerprint "
                                f"{to_hex(receipt.engine_fingerprint_hash)} and model "
                                f"{to_hex(receipt.model_id)} coverageNotice before issuedAt "
                                f"{receipt.issued_at}: the receipt would be slashable",
                                retry_after=self.retry_after_s)


@dataclass
class OperatorRuntime:
    evidence: EvidencePipeline
    publisher: Publisher | None  # None for a serving replica (stream mode): the committer's
    outbox: Outbox
    da: DAClient
    readiness: Readiness = field(default_factory=Readiness)
    monitors: MonitorThread | None = None
    unsafe: list[str] = field(default_factory=list)
    selftest: SelfTestGate | None = None
    claims: ClaimResponder | None = None  # with a chain: answers unpublished claims
    # stream mode: where the committer batched each receipt (GET /v1/receipts on any replica)
    receipt_index: StreamBatchIndex | None = None

    def close(self, drain_timeout_s: float = 10.0) -> None:
        if self.monitors is not None:
            self.monitors.stop()
        if self.publisher is not None:
            self.publisher.stop(drain_timeout_s=drain_timeout_s)
        if self.claims is not None:
            self.claims.stop()
        self.outbox.close()


def unsafe_reasons(cfg: OperatorConfig) -> list[str]:
    """What makes this configuration unfit for production (empty: nothing known)."""
    out = []
    if not isinstance(cfg.sink, ChainSink):
        out.append("no chain: batches go to a local JSONL file and nothing on chain can "
                   "challenge or slash these receipts")
    if cfg.challenge_manager.lower() == ZERO_ADDRESS:
        out.append("receipts name the zero address as verifyingContract")
    if cfg.kms_provisioned_locally:
        out.append("the KMS epoch was provisioned locally: seal keys, sealed shares and the "
                   "attestation root key sit in one directory beside the operator key")
    return out


def _bind_chain(sink: ChainSink, domain: Domain) -> Any:
    """Checks the chain binding (see the module doc); returns the bound contracts."""
    from verinfer.chain.deploy import Deployment
    from verinfer.chain.rpc import bounded_web3

    dep = Deployment.load(Path(sink.deployment))
    w3 = bounded_web3(sink.rpc_url)
    try:
        connected = int(w3.eth.chain_id)
    except Exception as e:  # any RPC failure: the binding is unproven
        raise OperatorConfigError(f"cannot read the chain id from {sink.rpc_url}: {e}"
                                  ) from None
    ids = {"operator.json chain_id": domain.chain_id, "deployment chain_id": dep.chain_id,
           "connected chain": connected}
    if len(set(ids.values())) != 1:
        raise OperatorConfigError("refusing to sign receipts for another chain: " + ", ".join(
            f"{k} = {v}" for k, v in ids.items()))
    if domain.verifying_contract.lower() != dep.challenge_manager.lower():
        raise OperatorConfigError(
            f"operator.json names verifyingContract {domain.verifying_contract}, the deployment "
            f"has ChallengeManager {dep.challenge_manager}")
    contracts = dep.bind(w3)
    on_chain = contracts.challenges.domain_separator()
    if on_chain != domain.separator:
        raise OperatorConfigError(
            f"the ChallengeManager at {dep.challenge_manager} has EIP-712 domain separator "
            f"{to_hex(on_chain)}, receipts would use {to_hex(domain.separator)}")
    return contracts


class SelfTestGate:
    """The determinism self-test as a readiness blocker (issue 18): no receipt is signed
    under an engine before its backend has passed the self-test on this machine, and never
    after it failed. The report is kept with the operator's state
    (``selftest/<fingerprint hash>.json``) and reused while the approved fingerprint — backend,
    versions, settings, weights, device and threads — is the same; its summary is shown in
    /health (``engine_fingerprint.reported.selftest``) and a failure also there under
    ``not_ready`` (and as ``verinfer_ready`` 0 in /metrics)."""

    NAME = "selftest"

    def __init__(self, readiness: Readiness, engines: Sequence[Engine], state_dir: Path,
                 run: Callable[[Engine], Any] | None = None) -> None:
        self.readiness, self.engines, self.state_dir = readiness, list(engines), state_dir
        self._run = run
        self.thread: threading.Thread | None = None

    def report_path(self, engine: Engine) -> Path:
        return self.state_dir / "selftest" / f"{engine.fingerprint.hash.hex()}.json"

    def start(self) -> SelfTestGate:
        self.readiness.block(self.NAME, "the engine determinism self-test is running",
                             retry_after_s=30.0)
        self.thread = threading.Thread(target=self._check_all, name="verinfer-selftest",
                                       daemon=True)
        self.thread.start()
        return self

    def _check_all(self) -> None:
        from verinfer.engine.selftest import SelfTestFailedError, require_pass

        try:
            for eng in self.engines:
                report = self._report(eng)
                eng.fingerprint.reported["selftest"] = report.summary()
                require_pass(report)
        except SelfTestFailedError as e:
            self.readiness.block(self.NAME, e.args[0], retry_after_s=3600.0)
            return
        except Exception as e:  # the self-test could not even run: nothing proven
            log.exception("engine self-test crashed")
            self.readiness.block(self.NAME, f"the engine self-test could not run "
                                 f"({type(e).__name__}: {str(e)[:200]})", retry_after_s=3600.0)
            return
        self.readiness.clear(self.NAME)

    def _report(self, eng: Engine) -> Any:
        from verinfer.engine.selftest import load_report, run_selftest

        path = self.report_path(eng)
        kept = load_report(path)
        if (kept is not None and kept.passed
                and kept.fingerprint_hash == to_hex(eng.fingerprint.hash)):
            log.info("engine self-test: reusing the passed report %s", path)
            return kept
        report = (self._run or run_selftest)(eng)
        report.save(path)
        log.warning("engine self-test %s (%s cases, %.0f s); report in %s",
                    "PASSED" if report.passed else "FAILED", len(report.cases), report.seconds,
                    path)
        return report


def build_runtime(cfg: OperatorConfig, engine: Engine | Sequence[Engine], *,
                  clock: Callable[[], float] = time.time,
                  monitor_interval_s: float | None = None,
                  check_identity: bool = True, selftest: bool = False) -> OperatorRuntime:
    """``engine``: the served engine, or every one when several models are served. Each
    model's id and engine fingerprint is checked against the allowlists on its own; while any
    one is not approved, signing stops for all (one readiness gate: a receipt for an unapproved
    model is slashable at challenge open, and the server cannot tell in advance which model the
    next request names)."""
    engines = [engine] if isinstance(engine, Engine) else list(engine)
    if not engines:
        raise OperatorConfigError("no engine to serve")
    rec = require_live(FileEpochRegistry(cfg.rel(cfg.epochs_file)), cfg.key_epoch)
    epoch_key = load_public_key(rec.suite, rec.public_key_bytes)
    backend = cfg.da.backend
    da = open_da(cfg)
    domain = Domain(cfg.chain_id, cfg.challenge_manager)
    readiness = Readiness()
    checks: list[tuple[str, Callable[[], None]]] = []
    before_sign: Callable[[Receipt], None] | None = None
    bp = cfg.backpressure
    deadline = (bp.publication_deadline_s if bp.publication_deadline_s is not None
                else DEFAULT_PUBLICATION_DEADLINE_S)
    if isinstance(cfg.sink, ChainSink):
        contracts = _bind_chain(cfg.sink, domain)
        # the deadline that counts is the one a claimant uses: the chain's
        deadline = float(contracts.config.params().publication_deadline)
        if check_identity:
            for i, eng in enumerate(engines):
                # one readiness reason per model ("identity", "identity-1", ...)
                name = ChainIdentity.NAME if i == 0 else f"{ChainIdentity.NAME}-{i}"
                checks.append((name, ChainIdentity(
                    readiness, contracts.config, eng.model_id, eng.fingerprint.hash,
                    interval_s=bp.identity_interval_s, NAME=name, stakes=contracts.stakes)))
            before_sign = CoverageGuard(contracts.stakes)
        else:
            log.warning("UNSAFE: signing without checking that the model and engine "
                        "fingerprint are approved on chain")
    stop_after = (bp.stop_after_s if bp.stop_after_s is not None
                  else deadline * DEFAULT_STOP_FRACTION)
    if not 0 < stop_after < deadline:
        raise OperatorConfigError(f"backpressure.stop_after_s must be in (0, {deadline:g}) "
                                  f"(the publication deadline), got {stop_after:g}")
    outbox = Outbox(cfg.rel(cfg.outbox), now=clock)
    publisher: Publisher | None = None
    record = None
    receipt_index = None
    if cfg.stream is not None:  # a serving replica: receipts go to the committer's stream
        from verinfer.operator.committer import StreamBatchIndex
        from verinfer.operator.stream import StreamMonitor, StreamRecorder, open_stream

        stream = open_stream(cfg, now=clock)
        receipt_index = StreamBatchIndex(stream.redis, stream.keys, da)
        record = StreamRecorder(stream, readiness, local_copy=(
            (lambda items, owner: outbox.enqueue_many(items, owner=owner))
            if cfg.stream.local_copy else None)).record
        checks.append((StreamMonitor.NAME, StreamMonitor(readiness, stream,
                                                         stop_after_s=stop_after)))
    evidence = EvidencePipeline(
        engines[0], ChainBoundSigner(cfg.private_key(), domain), domain,
        cfg.key_epoch, epoch_key, outbox, backend, clock=clock, before_sign=before_sign,
        record=record)
    if cfg.stream is None:
        pub = publisher = Publisher(outbox, da, open_sink(cfg),
                                    batch_max_entries=cfg.batch.max_entries,
                                    batch_max_age_s=cfg.batch.max_age_s)
        checks.append((BacklogMonitor.NAME, BacklogMonitor(
            readiness, outbox.oldest_pending_at, outbox.pending_count,
            stop_after_s=stop_after, max_pending=bp.max_pending, clock=clock,
            last_error=lambda: pub.last_error)))
    interval = (monitor_interval_s if monitor_interval_s is not None
                else bp.check_interval_s)
    monitors = MonitorThread(readiness, checks, interval_s=interval)
    claims = None
    if cfg.stream is not None and isinstance(cfg.sink, ChainSink):
        log.info("stream mode: unpublished claims are answered by `verinfer operator "
                 "commit` (the lease holder), not by this replica")
    elif isinstance(cfg.sink, ChainSink):  # built before any thread starts: it may refuse
        from verinfer.operator.claims import ClaimResponder

        claims = ClaimResponder.connect(
            cfg.sink.rpc_url, Path(cfg.sink.deployment), private_key=cfg.private_key(),
            outbox=outbox, state_dir=cfg.root)
    runtime = OperatorRuntime(evidence, None if publisher is None else publisher.start(),
                              outbox, da, readiness, None,
                              unsafe_reasons(cfg), receipt_index=receipt_index)
    runtime.monitors = monitors.start()
    if claims is not None:
        runtime.claims = claims.start()
    if selftest:
        runtime.selftest = SelfTestGate(readiness, engines, cfg.root).start()
    return runtime
