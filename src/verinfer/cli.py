"""The `verinfer` command."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Annotated, Any

import typer
from typer import _click as click  # typer ships its own click; its group API is that one's
from typer.core import TyperCommand, TyperGroup


# Each part owns its sub-commands in `<part>/cli.py`, a typer app named `app`. They load on
# first use: importing every part (torch, web3, …) costs seconds, and the devnet starts a
# dozen `verinfer …` processes that each need one part only. The tree is by user (operator,
# verifier, KMS, ...); the short aliases (`serve`, `audit`, `challenge`) are the same commands.
@dataclass(frozen=True)
class _Lazy:
    module: str  # its typer app `app` ...
    help: str  # the one line `--help` lists, so listing the tree loads none of it
    command: str | None = None  # ... or one command of that app


_VERIFIER: dict[str, _Lazy] = {
    "run": _Lazy("verinfer.verifier.cli", "Run a verifier node: committee duties and light "
                 "audits.", "run"),
    "audit": _Lazy("verinfer.verifier.audit_cli", "Light audits (no slashing); escalate "
                   "mismatches to full challenges."),
    "challenge": _Lazy("verinfer.verifier.challenge_cli", "Open a full challenge (or a "
                       "unpublished claim) and follow it."),
}
_SUBCOMMANDS: dict[str, _Lazy | dict[str, _Lazy]] = {
    "operator": _Lazy("verinfer.operator.cli", "Operator: serve the API, keystore, evidence "
                      "configuration, stake, publication status."),
    "verifier": _VERIFIER,
    "kms": _Lazy("verinfer.kms.cli", "Threshold KMS: key epochs and shard servers."),
    "enclave": _Lazy("verinfer.enclave.cli", "Software enclave (not a security boundary): "
                     "attestation root, measurements, key-release runs; TDX quotes."),
    "da": _Lazy("verinfer.da_client.cli", "Data availability: get/put blobs, batch proofs, the "
                "publication outbox."),
    "chain": _Lazy("verinfer.chain.cli", "Contracts: deploy, stake, unbond."),
    "receipts": _Lazy("verinfer.receipts.cli", "Receipts: vectors, verification, EIP-712 typed "
                      "data."),
    "devnet": _Lazy("verinfer.devnet.cli", "Local network: anvil, contracts, KMS, DA, "
                    "operator, verifiers."),
    "explorer": _Lazy("verinfer.explorer.cli", "Web explorer: receipts, batches, challenges, "
                      "votes and slashes in the browser.", "explorer"),
    "client": _Lazy("verinfer.client.cli", "Verified client: follow kept receipts (watch), "
                    "show their progress (status)."),
    "reproduce": _Lazy("verinfer.auditor.cli", "Auditors: reproduce a receipt on this "
                       "machine, from its signature to a replay (docs/cookbook.md).",
                       "reproduce"),
    "model": _Lazy("verinfer.engine.model_cli", "Models: export-hf (the HF folder vLLM loads)."),
    "selftest": _Lazy("verinfer.engine.model_cli", "Determinism self-test of a backend.",
                      "selftest"),
    # aliases: the everyday commands under their short names
    "serve": _Lazy("verinfer.operator.cli", "Serve the OpenAI-compatible API (= `verinfer "
                   "operator serve`).", "serve"),
    "audit": replace(_VERIFIER["audit"], help="Light audits (= `verinfer verifier audit`)."),
    "challenge": replace(_VERIFIER["challenge"], help="Open a challenge and follow it "
                         "(= `verinfer verifier challenge`)."),
}


class _LazyGroup(TyperGroup):
    """A group whose sub-commands (``lazy``) are imported when one is used, not listed."""

    lazy: dict[str, _Lazy | dict[str, _Lazy]] = _SUBCOMMANDS
    _listing = False

    def list_commands(self, ctx: click.Context) -> list[str]:
        return [*super().list_commands(ctx), *self.lazy]

    def format_help(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        # listing a command asks get_command for it: hand out placeholders with the table's
        # help line meanwhile, so `verinfer --help` imports no part
        self._listing = True
        try:
            super().format_help(ctx, formatter)
        finally:
            self._listing = False

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        entry = self.lazy.get(cmd_name)
        if entry is None:
            return super().get_command(ctx, cmd_name)
        if isinstance(entry, dict):  # a nested tree (verifier): lazy in its turn
            tree = _LazyGroup(name=cmd_name, no_args_is_help=True,
                              help="Verifier: node, light audits, challenges.")
            tree.lazy = dict(entry)
            return tree
        if self._listing:
            return TyperCommand(name=cmd_name, help=entry.help)
        import importlib

        # get_group, not get_command: a one-command part must stay a group
        group = typer.main.get_group(importlib.import_module(entry.module).app)
        cmd = group if entry.command is None else group.get_command(ctx, entry.command)
        if cmd is None:
            raise RuntimeError(f"{entry.module} has no command {entry.command!r}")
        cmd.name = cmd_name
        return cmd


app = typer.Typer(cls=_LazyGroup, help="verinfer: verifiable inference on a deterministic "
                  "engine.", no_args_is_help=True)

ModelOpt = Annotated[str | None, typer.Option(
    "--model", help="Path to a .gguf/.safetensors model (default: embedded Gemma 3 270M).")]


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
    cmd = [sys.executable, "-m", "verinfer", "operator", "serve", "--port", str(port),
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


def repository_root() -> Path | None:
    """The source checkout this package runs from (``src/verinfer`` -> the root), or None
    when installed without it (a wheel in site-packages has no bench/ beside it)."""
    root = Path(__file__).resolve().parents[2]
    return root if (root / "bench").is_dir() and (root / "pyproject.toml").is_file() else None


def bench_names(root: Path) -> list[str]:
    return sorted(p.stem for p in (root / "bench").glob("*.py") if not p.stem.startswith("_"))


@app.command("bench", context_settings={"allow_extra_args": True,
                                        "ignore_unknown_options": True})
def bench(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="A script of bench/ (engine, serve, kms, da, "
                                             "receipts, challenge, kernels, gas, ...).")],
) -> None:
    """Run bench/NAME.py of the repository from any directory; further arguments go to it."""
    from verinfer.cli_errors import fail

    root = repository_root()
    if root is None:
        raise fail("the benchmarks ship with the source repository, not with the installed "
                   "package: clone it and run `verinfer bench` from its environment "
                   "(scripts/bootstrap)")
    names = bench_names(root)
    if name not in names:  # a name, never a path: nothing outside bench/ runs
        raise fail(f"no benchmark {name!r}; there are: {', '.join(names)}")
    # as `python bench/NAME.py ARGS` would (its directory first on sys.path, its own argv);
    # the caller's working directory stays, so relative paths in ARGS mean what they say
    rc = subprocess.call([sys.executable, str(root / "bench" / f"{name}.py"), *ctx.args])
    raise typer.Exit(rc)


if __name__ == "__main__":
    app()
