"""The `verinfer` command."""

from __future__ import annotations

import os
import runpy
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Annotated, Any

import typer
from typer import _click as click  # typer ships its own click; its group API is that one's
from typer.core import TyperGroup

# Each part owns its sub-commands in `<part>/cli.py`, a typer app named `app`. They load on
# first use: importing every part (torch, web3, …) costs ~2.5 s, and the devnet starts a
# dozen `verinfer …` processes that each need one part only.
_SUBCOMMANDS = {
    "da": "verinfer.da_client.cli",
    "kms": "verinfer.kms.cli",
    "enclave": "verinfer.enclave.cli",
    "chain": "verinfer.chain.cli",
    "receipts": "verinfer.receipts.cli",
    "operator": "verinfer.operator.cli",
    "verifier": "verinfer.verifier.cli",
    "audit": "verinfer.verifier.audit_cli",
    "challenge": "verinfer.verifier.challenge_cli",
    "devnet": "verinfer.devnet.cli",
}


class _LazyGroup(TyperGroup):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return [*super().list_commands(ctx), *_SUBCOMMANDS]

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        module = _SUBCOMMANDS.get(cmd_name)
        if module is None:
            return super().get_command(ctx, cmd_name)
        import importlib

        # get_group, not get_command: a one-command part (`verifier run`) must stay a group
        cmd = typer.main.get_group(importlib.import_module(module).app)
        cmd.name = cmd_name
        return cmd


app = typer.Typer(cls=_LazyGroup, help="verinfer: verifiable inference on a deterministic "
                  "engine.", no_args_is_help=True)
bench_app = typer.Typer(help="Benchmarks (run from the repository root).", no_args_is_help=True)
app.add_typer(bench_app, name="bench")

ModelOpt = Annotated[str | None, typer.Option(
    "--model", help="Path to a .gguf/.safetensors model (default: embedded Gemma 3 270M).")]
ModelsOpt = Annotated[list[str] | None, typer.Option(
    "--model", help="A model to serve, repeatable: a name (gemma3-270m, smollm2-135m-instruct: "
                    "models shipped as PyPI packages) or a .gguf/.safetensors path. A request's "
                    "`model` picks one. Default: gemma3-270m.")]
KernelsOpt = Annotated[str, typer.Option("--kernels", help="invariant | fast")]


def _model_path(model: str | None) -> Path:
    from verinfer.engine.loader import embedded_model_path, resolve_model_path

    return resolve_model_path(model) if model else embedded_model_path()


def _kernels(mode: str) -> str:
    if mode not in ("invariant", "fast"):
        raise typer.BadParameter("--kernels must be 'invariant' or 'fast'")
    return mode


@app.command()
def serve(
    model: ModelsOpt = None,
    host: Annotated[str, typer.Option()] = "127.0.0.1",
    port: Annotated[int, typer.Option()] = 8000,
    kernels: KernelsOpt = "invariant",
    max_seqs: Annotated[int, typer.Option(help="Sequences decoded together.")] = 16,
    max_context: Annotated[int, typer.Option(help="Context limit served.")] = 8192,
    name: Annotated[str | None, typer.Option(
        help="Model name clients send (one --model only; default: the model's name).")] = None,
    api_keys_file: Annotated[Path | None, typer.Option(
        help="File with one API key per line (else $VERINFER_API_KEYS, comma-separated); "
             "none = open API.")] = None,
    rate_limit: Annotated[float | None, typer.Option(
        help="Requests per minute per API key (or per client address).")] = None,
    operator_dir: Annotated[Path | None, typer.Option(
        help="Operator state directory (from `verinfer operator init`): signs a receipt for "
             "every response and publishes the evidence.")] = None,
    unsafe_no_evidence: Annotated[bool, typer.Option(
        help="Serve without receipts or published evidence (nothing is verifiable).")] = False,
    unsafe_dev: Annotated[bool, typer.Option(
        help="Allow production-unsafe operator modes (no chain, zero verifyingContract, a "
             "locally provisioned KMS): demos and tests only.")] = False,
    unsafe_skip_identity_check: Annotated[bool, typer.Option(
        hidden=True, help="Sign even while the model or engine fingerprint is not approved "
                          "on chain (tests that play a careless operator).")] = False,
) -> None:
    """Serve the OpenAI-compatible API."""
    import uvicorn

    from verinfer.engine.engine import Engine
    from verinfer.engine.loader import load_model
    from verinfer.errors import VerinferError
    from verinfer.operator.app import ServerConfig, create_app

    keys = [k.strip() for k in os.environ.get("VERINFER_API_KEYS", "").split(",") if k.strip()]
    if api_keys_file is not None:
        keys = [k.strip() for k in api_keys_file.read_text().splitlines() if k.strip()]
    from verinfer.engine.loader import MODEL_NAMES, LoadedModel

    wanted = list(model or ["gemma3-270m"])
    if name is not None and len(wanted) > 1:
        typer.echo("error: --name applies to a single --model (named models keep their "
                   "names)", err=True)
        raise typer.Exit(2)
    if (operator_dir is None) == (not unsafe_no_evidence):
        typer.echo("error: pass --operator-dir DIR (see `verinfer operator init`) or, to serve "
                   "without any verifiable evidence, --unsafe-no-evidence", err=True)
        raise typer.Exit(2)
    loaded_by_name: dict[str, LoadedModel] = {}
    for m in wanted:
        try:
            loaded = load_model(_model_path(m))
        except VerinferError as e:
            typer.echo(f"error: {m}: {e.message}", err=True)
            raise typer.Exit(2) from e
        served = name or (m if m in MODEL_NAMES else _default_name(loaded.name))
        if served in loaded_by_name:
            typer.echo(f"error: two models would be served as {served!r}", err=True)
            raise typer.Exit(2)
        loaded_by_name[served] = loaded
    engines = {n: Engine(lm, _kernels(kernels), max_seqs=max_seqs,  # type: ignore[arg-type]
                         max_context=max_context) for n, lm in loaded_by_name.items()}
    runtime = None
    unsafe = ["no evidence: responses carry no receipt and nothing is published"] \
        if unsafe_no_evidence else []
    if operator_dir is not None:
        from verinfer.operator.config import OperatorConfig
        from verinfer.operator.runtime import build_runtime, unsafe_reasons

        try:
            cfg = OperatorConfig.load(operator_dir)
            unsafe = unsafe_reasons(cfg)
            if unsafe and not unsafe_dev:
                for eng in engines.values():
                    eng.close()
                typer.echo("error: this operator configuration is unsafe for production:\n  - "
                           + "\n  - ".join(unsafe) + "\nconfigure a chain (`operator init "
                           "--rpc-url --deployment --epochs-file`) or pass --unsafe-dev for a "
                           "demo", err=True)
                raise typer.Exit(2)
            runtime = build_runtime(cfg, list(engines.values()),
                                    check_identity=not unsafe_skip_identity_check)
        except VerinferError as e:
            for eng in engines.values():
                eng.close()
            typer.echo(f"error: {e.message}", err=True)
            raise typer.Exit(2) from e
    for reason in unsafe:
        typer.echo(f"WARNING: UNSAFE MODE: {reason}", err=True)
    for served_name, eng in engines.items():
        typer.echo(f"serving {served_name} ({eng.model_id[:18]}…) on http://{host}:{port}/v1 "
                   f"[{eng.fingerprint.system_fingerprint}]", err=True)
    try:
        config = ServerConfig(api_keys=keys, rate_limit_per_minute=rate_limit,
                              evidence=runtime.evidence if runtime else None,
                              readiness=runtime.readiness if runtime else None, unsafe=unsafe)
        uvicorn.run(create_app(engines, None, config), host=host, port=port,
                    log_level="warning")
    finally:
        if runtime is not None:
            runtime.close()
        for eng in engines.values():
            eng.close()


def _default_name(model_name: str) -> str:
    return model_name.lower().replace(" ", "-")


CHAT_MODEL, COMPLETION_MODEL = "smollm2-135m-instruct", "gemma3-270m"


@app.command()
def demo(
    model: ModelOpt = None,
    prompt: Annotated[str, typer.Option(help="The chat question.")] =
        "What is a lighthouse? Answer in one sentence.",
    completion_prompt: Annotated[str, typer.Option(help="The text to complete.")] =
        "The history of the printing press begins",
    max_tokens: Annotated[int, typer.Option()] = 40,
    port: Annotated[int, typer.Option(help="0 = pick a free port")] = 0,
) -> None:
    """The main job: start `verinfer serve` with both shipped models -- SmolLM2-135M-Instruct
    answers the chat request, Gemma 3 270M (a base model) the text completion -- and send one
    of each through the official openai SDK, checking each answer's signed receipt. ``--model``
    serves that one model for both instead."""
    import tempfile

    from openai import OpenAI

    port = port or _free_port()
    state = Path(tempfile.mkdtemp(prefix="verinfer-demo-"))
    init = subprocess.run([sys.executable, "-m", "verinfer", "operator", "init", str(state),
                           "--batch-max-age-s", "1", "--unsafe-dev"], capture_output=True,
                          text=True)
    if init.returncode != 0:
        typer.echo(init.stderr, err=True)
        raise typer.Exit(init.returncode)
    cmd = [sys.executable, "-m", "verinfer", "serve", "--port", str(port),
           "--operator-dir", str(state), "--unsafe-dev"]  # one-process demo: no chain
    if model:
        cmd += ["--model", model, "--name", "default"]
        chat_model = completion_model = "default"
    else:
        cmd += ["--model", COMPLETION_MODEL, "--model", CHAT_MODEL]
        chat_model, completion_model = CHAT_MODEL, COMPLETION_MODEL
    server = subprocess.Popen(cmd, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        client = OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0)
        _wait_ready(client, server)
        typer.echo(f"models: {', '.join(m.id for m in client.models.list().data)}")
        t0 = time.perf_counter()
        r = client.chat.completions.create(
            model=chat_model, messages=[{"role": "user", "content": prompt}],
            max_tokens=max_tokens, temperature=0.0)
        typer.echo(f"\n== chat ({chat_model}) ==")
        typer.echo(f"prompt:  {prompt}")
        typer.echo(f"answer:  {r.choices[0].message.content!r}")
        _demo_evidence(r, port, time.perf_counter() - t0)
        t0 = time.perf_counter()
        c = client.completions.create(model=completion_model, prompt=completion_prompt,
                                      max_tokens=max_tokens, temperature=0.0)
        typer.echo(f"\n== completion ({completion_model}) ==")
        typer.echo(f"prompt:  {completion_prompt}")
        typer.echo(f"answer:  {c.choices[0].text!r}")
        _demo_evidence(c, port, time.perf_counter() - t0)
        typer.echo(f"\noperator state: {state}")
    finally:
        server.terminate()
        server.wait(timeout=30)


def _demo_evidence(r: Any, port: int, dt: float) -> None:
    """Prints a response's engine evidence and checks its receipt's signature and publication."""
    import httpx
    from eth_account import Account
    from eth_account.messages import encode_typed_data

    ev = (r.choices[0].model_extra or {}).get("verinfer", {})
    v = (r.model_extra or {})["verification"]
    signer = Account.recover_message(encode_typed_data(full_message=v["receipt"]),
                                     signature=v["signature"])
    typer.echo(f"finish:  {r.choices[0].finish_reason}; usage: {r.usage}; {dt:.2f}s")
    typer.echo(f"system_fingerprint: {r.system_fingerprint}")
    typer.echo(f"model_id: {ev.get('model_id')}  logit_digest: {ev.get('logit_digest')}")
    typer.echo(f"receipt: {v['receipt_id']} signed by {signer} "
               f"({'matches' if signer == v['operator'] else 'DOES NOT MATCH'} the operator)")
    typer.echo(f"req_hash: {v['req_hash']}  out_hash: {v['out_hash']}")
    typer.echo(f"ciphertext: {v['da_pointer']} (key epoch {v['key_epoch']})")
    deadline = time.monotonic() + 30
    st: dict[str, object] = {}
    while time.monotonic() < deadline:
        st = httpx.get(f"http://127.0.0.1:{port}/v1/receipts/{v['receipt_id']}").json()
        if st.get("state") == "committed":
            break
        time.sleep(0.5)
    typer.echo(f"publication: {st.get('state')}; batch: {st.get('batch')}")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_ready(client: object, server: subprocess.Popen[bytes], timeout: float = 600) -> None:
    import httpx

    base = str(client.base_url).rstrip("/").removesuffix("/v1")  # type: ignore[attr-defined]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise typer.Exit(f"server exited with code {server.returncode}")  # type: ignore[arg-type]
        try:
            if httpx.get(base + "/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise TimeoutError("server did not become ready")


@app.command("tiny-model")
def tiny_model(out: Path, seed: Annotated[int, typer.Option()] = 0) -> None:
    """Write the tiny seeded-random Llama test model as a GGUF file."""
    from verinfer.engine.tiny import write_tiny_llama

    typer.echo(str(write_tiny_llama(out, seed)))


@bench_app.command("engine")
def bench_engine() -> None:
    """Run bench/engine.py (Gemma 3 270M vs HF transformers)."""
    script = Path("bench/engine.py")
    if not script.exists():
        typer.echo("run from the repository root: bench/engine.py not found", err=True)
        raise typer.Exit(2)
    sys.argv = [str(script)]
    runpy.run_path(str(script), run_name="__main__")


if __name__ == "__main__":
    app()
