"""`verinfer devnet up|status|down|app-key|demo|challenge`: the arguments; the steps are
devnet/lifecycle.py (start, stop, status), devnet/demo.py and devnet/clock_cli.py (challenge,
mine-draws). Light to import: the heavy libraries (torch, web3, the engine) load inside a
command, after its first progress line, so `devnet up` and `devnet demo` say something at
once."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from verinfer.devnet.progress import Steps

app = typer.Typer(help="Local network: anvil, contracts, KMS, DA, operator, verifiers.",
                  no_args_is_help=True)
console = Console(stderr=True)
LOADING = "loading the devnet's libraries (torch, web3, the engine)"
#: a command another module defines, handed every argument as given (``--help`` too)
_FORWARD = {"ignore_unknown_options": True, "allow_extra_args": True}


@app.command()
def up(
    directory: Annotated[Path, typer.Option("--dir", help="State directory.")] = Path(".devnet"),
    model: Annotated[list[str] | None, typer.Option(
        help="A model the operator serves and the verifiers judge: a file or a name "
             "(gemma3-270m, smollm2-135m-instruct); repeat for several, the first is the "
             "default (default, or `tiny` alone: the tiny test model, fast to load, its "
             "answers noise; `devnet demo` serves the two shipped models).")] = None,
    verifiers: Annotated[int, typer.Option()] = 4,
    redis_url: Annotated[str, typer.Option()] = "redis://127.0.0.1:6379/0",
    operator_port: Annotated[int, typer.Option()] = 0,
    publish_log_heads_s: Annotated[float, typer.Option(
        help="Publish the shards' signed release-log heads (DA + chain) every this many "
             "seconds (`verinfer kms publish-heads`); 0: off.")] = 0.0,
    backend: Annotated[str, typer.Option(
        help="Engine backend of the operator and the verifiers: own | vllm (one .gguf "
             "model, default gemma3-270m; docs/backends.md). vllm approves the vLLM "
             "fingerprint of this machine.")] = "own",
    selftest_report: Annotated[list[Path] | None, typer.Option(
        help="A passed `verinfer selftest` report to hand the operator (it reuses one only "
             "when its fingerprint hash is the engine's, else it runs the self-test).")]
    = None,
) -> None:
    """Start everything and write <dir>/devnet.json (exit 2, saying what to run, when this
    machine lacks a set-up step, Redis, or a free --operator-port)."""
    steps = Steps(console)
    with steps.step(LOADING):
        from verinfer.devnet.lifecycle import start
        from verinfer.errors import VerinferError
    wanted = list(model or [])
    if wanted == ["tiny"]:
        wanted = []  # start() writes the tiny test model
    try:
        state = start(directory, wanted[0] if wanted else None, verifiers, redis_url,
                      operator_port, publish_log_heads_s=publish_log_heads_s,
                      more_models=wanted[1:], backend=backend,
                      selftest_reports=selftest_report or (), steps=steps)
    except VerinferError as e:  # e.g. a named model whose package is not installed
        console.print(f"[red]error[/red]: {e.message}")
        raise typer.Exit(2) from e
    typer.echo(json.dumps({k: state[k] for k in ("rpc_url", "operator_url", "redis_prefix",
                                                  "explorer_url")}))


@app.command()
def status(directory: Annotated[Path, typer.Option("--dir")] = Path(".devnet")) -> None:
    """Which processes are alive (a stopped one with the last line of its log), the chain
    head, the operator and explorer URLs; exit 1 when a process or the chain is down, 2 when
    there is no devnet in --dir."""
    from verinfer.devnet.lifecycle import DevnetStartError, status_of

    try:
        st = status_of(directory)
    except DevnetStartError as e:
        console.print(f"[red]error[/red]: {e.message}")
        raise typer.Exit(2) from e
    out = Console()
    t = Table(title=f"devnet {st.directory}")
    t.add_column("process")
    t.add_column("pid")
    t.add_column("alive")
    t.add_column("last log line (stopped)", overflow="fold")
    for p in st.processes:
        t.add_row(p.name, str(p.pid), "yes" if p.alive else "[red]no[/red]", p.reason)
    out.print(t)
    head = (f"block {st.chain_head}" if st.chain_head is not None
            else f"[red]not answering[/red] ({st.chain_error})")
    out.print(f"chain:    {st.rpc_url} head {head}")
    for label, url, ok in (("operator", st.operator_url, st.operator_answers),
                           ("explorer", st.explorer_url, st.explorer_answers)):
        if url:
            out.print(f"{label}: {url} " + ("(answers)" if ok else "[red](not answering)[/red]"))
    if not st.healthy:
        raise typer.Exit(1)


@app.command()
def down(directory: Annotated[Path, typer.Option("--dir")] = Path(".devnet")) -> None:
    """Stop every process this devnet started (by pid), delete its Redis keys and remove
    devnet.json."""
    from verinfer.devnet.lifecycle import stop

    stop(directory)


@app.command("app-key")
def app_key(
    directory: Annotated[Path, typer.Option("--dir")] = Path(".devnet"),
    out: Annotated[Path, typer.Option(help="Where to write the key file (0600).")]
    = Path("app-key.json"),
    epoch: Annotated[int, typer.Option(help="Key epoch.")] = 1,
) -> None:
    """Devnet only: write the app key `verinfer reproduce --app-key` takes, rebuilt from this
    devnet's key shares (all on one disk here; in a real deployment the app owner holds it)."""
    from verinfer.devnet.app_key import unsafe_devnet_app_key
    from verinfer.devnet.lifecycle import load_state
    from verinfer.errors import VerinferError

    try:
        root = Path(load_state(directory)["kms"]["root"])
        unsafe_devnet_app_key(root, out, epoch)
    except (VerinferError, KeyError, OSError) as e:
        why = e.message if isinstance(e, VerinferError) else f"{type(e).__name__}: {e}"
        console.print(f"[red]error[/red]: {why}")
        raise typer.Exit(2) from e
    console.print(f"app key of epoch {epoch} written to {out}")


@app.command()
def demo(
    directory: Annotated[Path | None, typer.Option(
        "--dir", help="Where the devnet lives (default: a new temporary directory).")] = None,
    model: Annotated[str | None, typer.Option(
        help="Model file, or `tiny` for the tiny test model (default: the two shipped "
             "models, gemma3-270m for completions and smollm2-135m-instruct for chat).")]
    = None,
    keep: Annotated[bool, typer.Option(help="Leave the devnet running afterwards.")] = False,
    max_tokens: Annotated[int, typer.Option(help="Tokens per answer.")] = 24,
) -> None:
    """Up, ask through the openai SDK, verify, wait for the batch, challenge one receipt,
    show the committee's verdict, down."""
    out = Console()
    out.rule("[bold]verinfer devnet demo")
    steps = Steps(out)
    with steps.step(LOADING):
        from verinfer.devnet.demo import run_demo
        from verinfer.devnet.lifecycle import STATE
        from verinfer.errors import VerinferError
    try:
        res = run_demo(directory, model, keep=keep, max_tokens=max_tokens, console=out,
                       steps=steps)
    except VerinferError as e:
        console.print(f"[red]error[/red]: {e.message}")
        raise typer.Exit(1) from e
    typer.echo(json.dumps({"status": res.status, "challenge_id": res.challenge_id,
                           "receipts": [a.verification["receipt_id"] for a in res.answers],
                           "signers_ok": all(a.signer == a.verification["operator"]
                                             for a in res.answers),
                           "seconds": {k: round(v, 1) for k, v in res.seconds.items()}}))
    if keep and directory is not None and (directory.resolve() / "devnet" / STATE).exists():
        kept = json.loads((directory.resolve() / "devnet" / STATE).read_text())
        console.print(f"explorer (left up): {kept.get('explorer_url')}")
    if res.status != "dismissed":
        raise typer.Exit(1)


@app.command("challenge", context_settings=_FORWARD, add_help_option=False, help=(
    "`verinfer challenge` on the devnet's anvil: mines to the draw block, passes a claim's "
    "deadline at once and skips a voting phase that stalls (anvil only; the service's "
    "`verinfer challenge` waits for a real chain)."))
def challenge(ctx: typer.Context) -> None:
    _forward("challenge", ctx.args)


@app.command("mine-draws", hidden=True, context_settings=_FORWARD, add_help_option=False)
def mine_draws(ctx: typer.Context) -> None:
    """Mine anvil past each challenge's draw block, until stopped (`devnet up` runs it)."""
    _forward("mine-draws", ctx.args)


def _forward(name: str, args: list[str]) -> None:
    from verinfer.devnet.clock_cli import app as clock_app

    typer.main.get_command(clock_app).main(args=[name, *args], prog_name="verinfer devnet")
