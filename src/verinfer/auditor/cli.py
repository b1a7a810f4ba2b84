"""`verinfer reproduce REF`: check one receipt from its signature to a replay on this machine.

Exit codes: 0 reproduced, 1 mismatch (the operator's evidence is wrong; the `verinfer
challenge` command that escalates is printed), 2 cannot reproduce (something the auditor lacks,
or an unusable input; a receipt signed by another engine backend than ``--backend`` among
them). ``--json`` prints one object on stdout at the end; the progress goes to stderr either
way.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console

from verinfer.auditor.report import Report, Step, Verdict
from verinfer.errors import VerinferError

if TYPE_CHECKING:
    from verinfer.auditor.reproduce import ChainAccess
    from verinfer.da_client.factory import DARouter
    from verinfer.engine.backends import EngineChoice

app = typer.Typer(help="Reproduce a receipt on this machine (auditors).", no_args_is_help=True)
console = Console(stderr=True, highlight=False, soft_wrap=True)  # commands stay copyable

_MARK = {
    "ok": "[green]✓[/green]",
    "warn": "[yellow]![/yellow]",
    "fail": "[red]✗[/red]",
    "skip": "[dim]-[/dim]",
}


@app.command("reproduce")
def reproduce(
    ref: Annotated[
        str,
        typer.Argument(
            help="Receipt id (0x + 64 hex), DA pointer of its ciphertext, or a JSON file: an API "
            "response, its `verification` object, a signed receipt, a /v1/receipts answer."
        ),
    ],
    model: Annotated[
        list[str] | None,
        typer.Option(
            help="Model file (or shipped model name) to replay with; repeatable. The one whose "
            "sha256 is the receipt's model id is used."
        ),
    ] = None,
    app_key: Annotated[
        Path | None,
        typer.Option(help="JSON file with the key epoch's secret (opens the envelope)."),
    ] = None,
    transcript: Annotated[
        Path | None,
        typer.Option(
            help="JSON transcript of the exchange (instead of --app-key): must hash to the "
            "receipt's reqHash/outHash."
        ),
    ] = None,
    save_transcript: Annotated[
        Path | None,
        typer.Option(
            help="With --app-key: write the opened envelope as a transcript to hand over."
        ),
    ] = None,
    operator_url: Annotated[
        str | None,
        typer.Option(help="Operator base URL: a receipt id is looked up at its /v1/receipts/{id}."),
    ] = None,
    rpc_url: Annotated[
        str | None,
        typer.Option(
            envvar="VERINFER_CHAIN_RPC",
            help="Chain JSON-RPC URL (with --deployment: stake, "
            "batch inclusion, key epoch, approvals).",
        ),
    ] = None,
    deployment: Annotated[
        Path | None, typer.Option(help="deployment.json of the contracts.")
    ] = None,
    da_store: Annotated[Path | None, typer.Option(help="Local DA store directory.")] = None,
    da_redis_url: Annotated[str | None, typer.Option(help="Redis DA backend URL.")] = None,
    kernel_isa: Annotated[
        str | None,
        typer.Option(
            help="Force the kernels' ISA path: scalar, avx2, avx512 or auto (sets "
            "VERINFER_KERNEL_ISA; a path this CPU lacks is refused)."
        ),
    ] = None,
    backend: Annotated[
        str,
        typer.Option(
            help="Engine to replay with: own (the invariant CPU engine) | vllm (the receipt's "
            "fingerprint names the one it was signed under; docs/backends.md)."
        ),
    ] = "own",
    kernels: Annotated[str, typer.Option(help="own: invariant | fast")] = "invariant",
    vllm_threads: Annotated[
        int,
        typer.Option(
            help="vllm: CPU threads (part of the fingerprint's hardware class: the operator's)."
        ),
    ] = 1,
    vllm_export_dir: Annotated[
        Path | None,
        typer.Option(
            help="vllm: the `verinfer model export-hf` folder (default: exported into the cache "
            "on first use)."
        ),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object on stdout.")] = False,
) -> None:
    """Reproduce a receipt: signature, batch, ciphertext, opening, environment, replay."""
    from verinfer.engine.backends import EngineChoice

    try:
        # a verifier's configuration: one sequence at a time, the model's own context limit
        engine = EngineChoice(backend, kernels, vllm_threads, export_dir=vllm_export_dir)
        report = _run(
            ref,
            model or [],
            app_key,
            transcript,
            save_transcript,
            operator_url,
            rpc_url,
            deployment,
            da_store,
            da_redis_url,
            kernel_isa,
            engine,
        )
    except VerinferError as e:  # an unusable input (key file, transcript, deployment, ISA)
        report = Report(verdict=Verdict("cannot_reproduce", e.message[:500]))
    except Exception as e:  # the auditor's own fault: a traceback exits 1, which reads "mismatch"
        console.print_exception()
        report = Report(
            verdict=Verdict(
                "cannot_reproduce", f"the auditor failed ({type(e).__name__}: {str(e)[:300]})"
            )
        )
    _print_verdict(report, as_json)
    raise typer.Exit(report.verdict.exit_code)


def _run(
    ref: str,
    models: list[str],
    app_key: Path | None,
    transcript: Path | None,
    save_transcript: Path | None,
    operator_url: str | None,
    rpc_url: str | None,
    deployment: Path | None,
    da_store: Path | None,
    da_redis_url: str | None,
    kernel_isa: str | None,
    engine: EngineChoice,
) -> Report:
    from verinfer.auditor.material import AuditInputError, load_app_key, load_transcript
    from verinfer.auditor.reproduce import AuditConfig, Auditor

    if app_key is not None and transcript is not None:
        raise AuditInputError("pass --app-key or --transcript, not both", param="app_key")
    if save_transcript is not None and app_key is None:
        raise AuditInputError("--save-transcript needs --app-key", param="save_transcript")
    if kernel_isa is not None:
        _force_isa(kernel_isa)
    da_args: list[str] = []
    if da_store is not None:
        da_args += ["--da-store", str(da_store)]
    if da_redis_url is not None:
        da_args += ["--da-redis-url", da_redis_url]
    cfg = AuditConfig(
        models=models,
        operator_url=operator_url,
        save_transcript=save_transcript,
        app_key=load_app_key(app_key) if app_key else None,
        transcript=load_transcript(transcript) if transcript else None,
        da_args=da_args,
        da_backends=[b for b, on in (("local", da_store), ("redis", da_redis_url)) if on],
        engine=engine,
    )
    chain, da = _wire(rpc_url, deployment, da_store, da_redis_url)
    status = console.status("starting…")
    status.start()

    def started(name: str) -> None:
        status.update(f"{name}…")

    def done(step: Step) -> None:
        console.print(f"{_MARK[step.status]} [bold]{step.name:<11}[/bold] {step.detail}")

    try:
        return Auditor(cfg, chain=chain, da=da, on_step=done, on_start=started).run(ref)
    finally:
        status.stop()


def _force_isa(name: str) -> None:
    """Refuse a path this CPU lacks (the cookbook's cross-ISA check must not silently run
    another one), then dispatch to it, before any kernel runs. VERINFER_KERNEL_ISA is set only
    after the check: the kernels read it when they load (here), and would refuse a missing
    path in their own words, naming a variable the auditor never set."""
    from verinfer.auditor.material import AuditInputError
    from verinfer.engine import kernels

    have = kernels.supported_isas()
    if name != "auto" and name not in have:
        raise AuditInputError(
            f"this CPU cannot run the {name} kernel path (it supports {', '.join(have)})",
            param="kernel_isa",
        )
    os.environ[kernels.ISA_ENV] = name  # what this process runs, for what it starts
    kernels.set_isa(name)


def _wire(
    rpc_url: str | None, deployment: Path | None, da_store: Path | None, da_redis_url: str | None
) -> tuple[ChainAccess | None, DARouter | None]:
    from verinfer.auditor.material import AuditInputError
    from verinfer.auditor.reproduce import ChainAccess
    from verinfer.chain.deploy import Deployment
    from verinfer.chain.rpc import bounded_web3
    from verinfer.da_client.factory import DAConfig, DARouter, open_client
    from verinfer.verifier.chain_view import ChainView

    da = None
    if da_store is not None or da_redis_url is not None:
        cfg = DAConfig(local_store=str(da_store) if da_store else None, redis_url=da_redis_url)
        da = DARouter(
            [open_client(b, cfg) for b, on in (("local", da_store), ("redis", da_redis_url)) if on]
        )
    if (rpc_url is None) != (deployment is None):
        raise AuditInputError("the chain needs both --rpc-url and --deployment", param="deployment")
    if rpc_url is None or deployment is None:
        return None, da
    d = Deployment.load(deployment)
    w3 = bounded_web3(rpc_url)
    contracts = d.bind(w3)
    return ChainAccess(ChainView(w3, d, contracts), contracts, rpc_url, deployment), da


def _print_verdict(report: Report, as_json: bool) -> None:
    v = report.verdict
    colour = {"reproduced": "green", "mismatch": "red", "cannot_reproduce": "yellow"}[v.outcome]
    console.print(f"[bold {colour}]verdict: {v.text()}[/bold {colour}]")
    if report.challenge_command:
        console.print(
            "escalate (the challenger's key from $VERINFER_CHAIN_PRIVATE_KEY or --keystore):"
        )
        console.print(f"  {report.challenge_command}", markup=False)
    if as_json:
        typer.echo(json.dumps(report.to_json()))
    else:
        typer.echo(v.text())
        if report.challenge_command:
            typer.echo(report.challenge_command)
