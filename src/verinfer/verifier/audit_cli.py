"""`verinfer audit --sample-rate r`: light audits of randomly sampled committed receipts."""

from __future__ import annotations

import json
import random
import time
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Annotated, Any

import redis
import typer
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from verinfer.cli_errors import fail
from verinfer.errors import VerinferError
from verinfer.kms.protocol import AuditAssignment
from verinfer.protocol.hexutil import to_hex
from verinfer.receipts.eip712 import check_issued_at
from verinfer.receipts.signed import SignedReceipt
from verinfer.verifier.audit_stream import AuditQueue, StreamKeys
from verinfer.verifier.chain_view import ChainView
from verinfer.verifier.challenger import Challenger, locate
from verinfer.verifier.cli_common import (
    DA_STORE_OPT,
    DEPLOYMENT_OPT,
    KEYSTORE_OPT,
    REDIS_DA_OPT,
    RPC_OPT,
    wire,
)
from verinfer.verifier.enclave_judge import BlobSource
from verinfer.verifier.reports import SignedAuditReport

app = typer.Typer(help="Light audits (no slashing); escalate mismatches to full challenges.")
console = Console(stderr=True)


def sample_receipts(view: ChainView, da: BlobSource, rate: float, rng: random.Random,
                    from_block: int | None = None) -> list[tuple[SignedReceipt, str]]:
    """Each receipt of every committed batch independently with probability ``rate``."""
    out = []
    for b in view.batches(from_block):
        try:
            m = view.manifest(da, b.manifest_pointer, b.leaf_count)
        except VerinferError as err:
            # one operator's unreadable manifest must not stop auditing everyone else's
            # (a full challenge of one of its receipts is what gets it slashed)
            console.print(f"[yellow]skipped batch[/yellow] 0x{b.root.hex()}: {err.message}")
            continue
        for e in m.entries:
            # another operator's receipt copied into this batch is not committed by it (the
            # contract looks a batch up under the receipt's operator), and the pointer beside
            # it is the copier's word: auditing it could only escalate against the wrong batch
            if e.signed.receipt.operator.lower() != b.operator.lower():
                continue
            if rng.random() < rate:
                out.append((e.signed, str(e.ciphertext)))
    return out


def _assigner(key_file: Path | None, timeout_s: float
              ) -> Callable[[SignedReceipt], AuditAssignment] | None:
    """Signs one assignment per sampled receipt: any registered verifier may take the job
    (the stream's consumer group decides who), valid until the audit's deadline plus slack.
    The scheduler, not the auditor, chose the receipt."""
    if key_file is None:
        return None
    from eth_account import Account

    from verinfer.kms.identity import sign_eip191
    from verinfer.kms.protocol import ANY_AUDITOR

    account = Account.from_key(key_file.read_text().strip())
    expires = int(time.time() + timeout_s + 600)

    def sign(s: SignedReceipt) -> AuditAssignment:
        a = AuditAssignment(s.receipt.struct_hash, ANY_AUDITOR, expires, b"")
        return AuditAssignment(a.receipt_hash, a.auditor, a.expires_at,
                               sign_eip191(account, a.digest()))
    return sign


def _last_id(q: AuditQueue, key: str) -> str:
    """The stream's last entry id ("0-0" when there is none): what this run reads after."""
    return str(q.r.xinfo_stream(key)["last-generated-id"]) if q.r.exists(key) else "0-0"


def dead_jobs(q: AuditQueue, after: str, wanted: Collection[str]) -> dict[str, str]:
    """Of ``wanted`` jobs, those the verifiers dead-lettered since entry ``after``, with why
    (the dead letter's error and the last attempt's, e.g. a KMS refusal)."""
    rows: Any = q.r.xrange(q.keys.dead, min=f"({after}" if after != "0-0" else "-")
    out = {}
    for _, f in rows:
        job = f.get("job")
        if job in wanted:
            last = f.get("last_error") or ""
            out[job] = f.get("error", "") + (f"; last error: {last}" if last else "")
    return out


def report_problem(rep: SignedAuditReport, job: SignedReceipt,
                   is_verifier: Callable[[str], bool], now: float) -> str | None:
    """Why a report on the stream must not count (None: it counts). The stream is writable by
    anyone with Redis access, and a counted mismatch can open a challenge with our bond, so a
    report counts only if it is about the job's receipt, signed by its auditor, that auditor is
    a registered verifier on chain, and it is not dated in the future (bounded skew; ``now`` is
    the later of the wall clock and the chain's, which lags on an idle chain)."""
    try:
        # the date first: beyond 2^53 the report cannot even be canonicalized (RFC 8785)
        check_issued_at(rep.report.issued_at, now, what="audit report")
        signer = rep.verify()
        if rep.report.receipt_digest != job.digest:
            return f"report {rep.report.job_id} is about another receipt"
        if rep.report.verdict.receipt_out_hash != job.receipt.out_hash:
            return f"report {rep.report.job_id} names another receipt outHash"
    except VerinferError as e:
        return f"report {rep.report.job_id}: {e.message}"
    except (ValueError, TypeError) as e:  # e.g. rfc8785 refusing a field: not a valid report
        return f"report {rep.report.job_id}: cannot be canonicalized ({type(e).__name__})"
    if not is_verifier(signer):
        return f"report {rep.report.job_id} signed by {signer}, not a registered verifier"
    return None


@app.callback(invoke_without_command=True)
def audit(
    sample_rate: Annotated[float, typer.Option(help="Fraction of receipts to audit.")] = 0.05,
    rpc_url: Annotated[str, RPC_OPT] = "http://127.0.0.1:8545",
    deployment: Annotated[Path, DEPLOYMENT_OPT] = Path("deployment.json"),
    keystore: Annotated[Path | None, KEYSTORE_OPT] = None,
    da_store: Annotated[Path | None, DA_STORE_OPT] = None,
    da_redis_url: Annotated[str | None, REDIS_DA_OPT] = None,
    redis_url: Annotated[str, typer.Option(help="Redis holding the audit streams.")]
    = "redis://127.0.0.1:6379/0",
    prefix: Annotated[str, typer.Option(help="Stream key prefix.")] = "verinfer:",
    seed: Annotated[int | None, typer.Option(help="Sampling seed (default: random).")] = None,
    timeout_s: Annotated[float, typer.Option()] = 300.0,
    from_block: Annotated[int | None, typer.Option(
        help="Only batches committed at or after this block (default: all).")] = None,
    escalate: Annotated[bool, typer.Option(
        help="Open a full challenge (bond from the key) for every mismatch.")] = False,
    as_json: Annotated[bool, typer.Option("--json")] = False,
    scheduler_key_file: Annotated[Path | None, typer.Option(
        help="Audit-scheduler private key (0x-hex file) the KMS shards trust "
             "(--audit-scheduler): each sampled job carries its signed assignment, which "
             "per-receipt epochs need for a light audit (docs/kms.md §8).")] = None,
) -> None:
    """Sample receipts from committed batches, queue audit jobs, collect signed reports."""
    if not 0.0 < sample_rate <= 1.0:
        raise typer.BadParameter(f"--sample-rate must be in (0, 1], got {sample_rate}")
    try:
        w = wire(rpc_url, deployment, keystore, da_store, da_redis_url, need_account=escalate)
        rng = random.Random(seed)
        with console.status("reading committed batches…"):
            picked = sample_receipts(w.view, w.da, sample_rate, rng, from_block)
        q = AuditQueue(redis.Redis.from_url(redis_url, decode_responses=True),
                       StreamKeys(prefix))
        start = _last_id(q, q.keys.reports)
        dead_start = _last_id(q, q.keys.dead)
        sign = _assigner(scheduler_key_file, timeout_s)
        jobs = {q.enqueue(s, p, sign(s) if sign else None): s for s, p in picked}
        got: dict[str, SignedAuditReport] = {}
        failed: dict[str, str] = {}  # job id -> why the verifiers gave it up
        refused: list[str] = []
        with Progress(TextColumn("auditing"), BarColumn(), TextColumn("{task.completed}/"
                      "{task.total}"), TimeElapsedColumn(), console=console) as prog:
            task = prog.add_task("audit", total=len(jobs))
            deadline = time.monotonic() + timeout_s
            while len(got) + len(failed) < len(jobs) and time.monotonic() < deadline:
                failed.update(dead_jobs(q, dead_start, jobs.keys() - got.keys()))
                for _, rep in q.reports(str(start)):
                    if rep.report.job_id in jobs and rep.report.job_id not in got:
                        problem = report_problem(rep, jobs[rep.report.job_id],
                                                 w.contracts.stakes.is_verifier,
                                                 max(time.time(), w.view.head()[1]))
                        if problem is not None:  # anyone can write the stream: skip, go on
                            refused.append(problem)
                            continue
                        got[rep.report.job_id] = rep
                prog.update(task, completed=len(got) + len(failed))
                time.sleep(0.2)
        mismatches = [r for r in got.values() if not r.report.verdict.agrees]
        escalated = []
        if escalate and mismatches:
            ch = Challenger(w.view, w.contracts, w.da)
            for rep in mismatches:
                kind, cid = ch.open(locate(w.view, w.da, to_hex(rep.report.receipt_digest)))
                escalated.append({"receipt": to_hex(rep.report.receipt_digest),
                                  kind: cid})
        missing = len(jobs) - len(got) - len(failed)
        summary = {"sampled": len(jobs), "reported": len(got), "matches": len(got) -
                   len(mismatches), "mismatches": len(mismatches), "escalated": escalated,
                   "failed": [{"job": j, "receipt": to_hex(jobs[j].digest), "error": why}
                              for j, why in failed.items()],
                   "missing": missing, "refused": refused}
        if as_json:
            typer.echo(json.dumps(summary))
        else:
            t = Table(title="light audit")
            for k in ("sampled", "reported", "matches", "mismatches", "failed", "missing"):
                v = summary[k]
                t.add_row(k, str(len(v) if isinstance(v, list) else v))
            console.print(t)
            for j, why in failed.items():
                console.print(f"[red]failed[/red] receipt {to_hex(jobs[j].digest)}: {why}")
            if missing:
                console.print(f"[yellow]{missing} job(s) got no report within {timeout_s:g} s"
                              "[/yellow]: is a verifier running on this Redis and prefix "
                              f"(`verinfer verifier run --audit-redis-url … --audit-prefix "
                              f"{prefix}`)?")
            for why in refused:
                console.print(f"[yellow]refused report[/yellow] {why}")
            for rep in mismatches:
                console.print(f"[red]mismatch[/red] 0x{rep.report.receipt_digest.hex()} "
                              f"{rep.report.verdict.reason} (auditor {rep.report.auditor})")
        if scheduler_key_file is None and any("audit_not_assigned" in w
                                              for w in failed.values()):
            console.print("the KMS shards open a receipt for a light audit only with the audit "
                          "scheduler's signed assignment: pass --scheduler-key-file (the key "
                          "the shards trust as --audit-scheduler; on a devnet "
                          "<dir>/kms/audit-scheduler.key; docs/kms.md §8)")
        if mismatches and not escalate:
            raise typer.Exit(3)
        if failed or missing:
            raise typer.Exit(4)
    except VerinferError as e:
        raise fail(e) from e
