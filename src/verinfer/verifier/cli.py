"""`verinfer verifier run`: a committee member node (and light-audit worker)."""

from __future__ import annotations

import signal
import sys
import threading
from pathlib import Path
from typing import Annotated

import redis
import typer
from rich.console import Console

from verinfer.chain.rpc import LOG_CHUNK_BLOCKS
from verinfer.chain.structs import ETHER
from verinfer.cli_errors import fail
from verinfer.engine.backends import EngineChoice
from verinfer.engine.loader import resolve_model_path
from verinfer.errors import VerinferError
from verinfer.kms.local_cluster import ClusterLayout
from verinfer.protocol.hexutil import to_hex
from verinfer.protocol.jsonsafe import SAFE_RECURSION_LIMIT
from verinfer.verifier.audit_stream import AuditJob, AuditWorker, StreamKeys
from verinfer.verifier.cli_common import (
    DA_STORE_OPT,
    DEPLOYMENT_OPT,
    KEYSTORE_OPT,
    LOG_CHUNK_OPT,
    REDIS_DA_OPT,
    RPC_OPT,
    wire,
)
from verinfer.verifier.enclave_judge import EnclaveConfig, EnclaveJudge
from verinfer.verifier.node import NodeConfig, VerifierNode
from verinfer.verifier.reexec import model_file_id
from verinfer.verifier.reports import SignedAuditReport
from verinfer.verifier.votes import Verdict

app = typer.Typer(help="Verifier node: committee duties and light audits.",
                  no_args_is_help=True)
console = Console(stderr=True)


@app.command()
def run(
    rpc_url: Annotated[str, RPC_OPT],
    deployment: Annotated[Path, DEPLOYMENT_OPT],
    model: Annotated[list[str], typer.Option(
        help="A model this verifier re-executes: a file or a name (gemma3-270m, "
             "smollm2-135m-instruct); repeat for several (each loads on first use).")],
    kms_dir: Annotated[Path, typer.Option(
        help="KMS layout root (epochs.json, shards.json, attestation/root.key).")],
    state_dir: Annotated[Path, typer.Option(help="Where votes and salts are kept.")],
    keystore: Annotated[Path | None, KEYSTORE_OPT] = None,
    da_store: Annotated[Path | None, DA_STORE_OPT] = None,
    da_redis_url: Annotated[str | None, REDIS_DA_OPT] = None,
    stake: Annotated[float, typer.Option(help="ETH to stake when not yet registered.")] = 1.0,
    container_digest: Annotated[str, typer.Option()] = "sha256:" + "00" * 32,
    code_hash: Annotated[str, typer.Option()] = "verinfer-devnet",
    enclave: Annotated[str, typer.Option(help="inprocess | process")] = "inprocess",
    audit_redis_url: Annotated[str | None, typer.Option(
        help="Serve light audits from this Redis (streams under --audit-prefix).")] = None,
    audit_prefix: Annotated[str, typer.Option()] = "verinfer:",
    poll_s: Annotated[float, typer.Option()] = 0.2,
    backend: Annotated[str, typer.Option(
        help="Engine backend that re-executes: own (the invariant CPU engine) | vllm (the "
             "operator's vLLM fingerprint on this machine; .gguf models; needs "
             "scripts/ci-extras.d/30-vllm or a CUDA vLLM, docs/backends.md). A receipt under "
             "another engine fingerprint is abstained on.")] = "own",
    kernels: Annotated[str, typer.Option(help="own: invariant | fast")] = "invariant",
    vllm_threads: Annotated[int, typer.Option(
        help="vllm: CPU threads (part of the fingerprint: the operator's count).")] = 1,
    log_chunk_blocks: Annotated[int, LOG_CHUNK_OPT] = LOG_CHUNK_BLOCKS,
) -> None:
    """Register (if needed), then follow the chain: judge, commit, reveal, resolve, withdraw."""
    # eth-account (py_ecc) raises the recursion limit to 100000, where a nested JSON answer
    # overflows the C stack in any stdlib parse (web3's RPC decoding included): put it back so
    # such bytes raise instead of killing the node. Our own parsers are bounded anyway.
    sys.setrecursionlimit(SAFE_RECURSION_LIMIT)
    try:
        wired = wire(rpc_url, deployment, keystore, da_store, da_redis_url,
                     log_chunk_blocks=log_chunk_blocks)
        assert wired.account is not None
        acct = wired.account
        lay = ClusterLayout(kms_dir, 0)
        if enclave not in ("inprocess", "process"):
            raise typer.BadParameter("--enclave must be inprocess or process")
        paths = [resolve_model_path(m) for m in model]
        choice = EngineChoice(backend, kernels, vllm_threads)
        if choice.backend == "vllm" and enclave == "inprocess" and len(set(paths)) > 1:
            # one vLLM engine per process (its CPU worker patches torch globals)
            raise typer.BadParameter("--backend vllm with --enclave inprocess judges one "
                                     "--model; several need --enclave process")
        cfg = EnclaveConfig(lay.root_key, lay.directory, lay.registry, container_digest,
                            code_hash, paths[0], mode=enclave,  # type: ignore[arg-type]
                            more_models=tuple(paths[1:]), engine=choice)
        judge = EnclaveJudge(cfg, acct, wired.da)
        state_dir.mkdir(parents=True, exist_ok=True)
        lock = threading.Lock()
        node = VerifierNode(wired.view, wired.contracts, acct, judge.judge, wired.da,
                            NodeConfig(state_dir / "votes.json"),
                            log=lambda m: console.log(m), tx_lock=lock)
        if node.ensure_registered(int(stake * ETHER)):
            console.log(f"registered verifier {acct.address} with {stake} ETH")
        # Committees are drawn only from verifiers declared for the receipt's (fingerprint,
        # model): declare each model this node holds with the fingerprint it re-executes
        # under (the own engine's is the same for every model; vLLM's names the weights).
        decl = node.ensure_declared((choice.fingerprint(p).hash, model_file_id(p)) for p in paths)
        for f, m in decl.declared:
            console.log(f"declared engine fingerprint {to_hex(f)} model {to_hex(m)}")
        for f, m in decl.unapproved:
            console.log(f"[yellow]engine fingerprint {to_hex(f)} or model {to_hex(m)} is not "
                        "approved on chain: "
                        "not declared, so never drawn for it[/yellow]")
        for (f, m), leave_at in decl.leaving:
            console.log(f"undeclaration of engine fingerprint {to_hex(f)} model {to_hex(m)} "
                        f"is pending (leaveAt {leave_at}): kept; this node still judges what "
                        "it is drawn for ('verinfer chain verifier declare' cancels the "
                        "undeclaration)")
        for pool, leave_at in decl.others:
            console.log(f"[red]declared for pool {to_hex(pool)}"
                        f"{'' if leave_at == 0 else f' (leaving, leaveAt {leave_at})'} but this "
                        "node holds no model for it: it will be drawn for those receipts and "
                        "penalised for not revealing. Run a node with that model, or "
                        "'verinfer chain verifier undeclare'[/red]")
    except VerinferError as e:
        raise fail(e) from e
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    if audit_redis_url is not None:
        def audit_judge(job: AuditJob) -> Verdict:
            return judge.judge(job.signed.receipt, job.ciphertext, purpose="light_audit",
                               challenge_id=f"audit-{job.job_id}",
                               assignment=job.assignment)

        def record(rep: SignedAuditReport) -> None:
            with lock:
                wired.contracts.audits.record_audit(
                    rep.report.receipt_digest, rep.report.verdict.vote,
                    rep.report.verdict.agrees, rep.report.report_hash)

        worker = AuditWorker(redis.Redis.from_url(audit_redis_url, decode_responses=True),
                             StreamKeys(audit_prefix), consumer=acct.address.lower(),
                             account=acct, judge=audit_judge, sink=record, min_idle_ms=5000)
        threading.Thread(target=worker.run, args=(stop.is_set,), daemon=True).start()
    console.log(f"verifier {acct.address} following {deployment}")
    node.run(stop.is_set, poll_s)
