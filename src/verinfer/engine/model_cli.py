"""`verinfer model export-hf GGUF DIR` and `verinfer selftest --backend own|vllm` (the engine
through the one backend dispatch, engine/backends.py).

Both load heavy parts (transformers, vLLM, the model) only inside the command.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from verinfer.cli_errors import fail

app = typer.Typer(
    help="Models: export-hf (the HF folder vLLM loads), backend self-test.", no_args_is_help=True
)


@app.command("export-hf")
def export_hf_cmd(
    gguf: Annotated[
        str, typer.Argument(help="A .gguf file or a shipped model name (gemma3-270m).")
    ],
    out_dir: Annotated[Path, typer.Argument(help="The folder to write (created).")],
    force: Annotated[
        bool, typer.Option(help="Overwrite a folder that holds something else.")
    ] = False,
) -> None:
    """Write the Hugging Face folder (float32 safetensors, config, tokenizer equal to ours)
    that vLLM loads, with every file's sha256 in verinfer-export.json."""
    from verinfer.engine.export_hf import export_hf
    from verinfer.engine.loader import resolve_model_path
    from verinfer.errors import VerinferError

    try:
        exp = export_hf(resolve_model_path(gguf), out_dir, force=force)
    except VerinferError as e:
        raise fail(e, exit_code=2) from e
    shown = {k: v for k, v in exp.manifest_json().items() if k != "files"}
    typer.echo(json.dumps({"dir": str(exp.path), **shown, "versions": exp.versions}, indent=2))


@app.command("selftest")
def selftest_cmd(
    backend: Annotated[str, typer.Option(help="own | vllm")] = "own",
    model: Annotated[
        str, typer.Option(help="A .gguf file or a shipped model name.")
    ] = "gemma3-270m",
    export_dir: Annotated[
        Path | None,
        typer.Option(help="vllm: the export-hf folder (default: exported once into the cache)."),
    ] = None,
    threads: Annotated[int, typer.Option(help="vllm: CPU threads.")] = 1,
    max_seqs: Annotated[int, typer.Option(help="Sequences the engine batches together.")] = 16,
    kernels: Annotated[str, typer.Option(help="own: invariant | fast")] = "invariant",
    device: Annotated[
        str, typer.Option(help="own: cpu (C++ kernels) | cuda (Triton kernels, docs/gpu.md)")
    ] = "cpu",
    out: Annotated[Path | None, typer.Option(help="Write the JSON report here.")] = None,
) -> None:
    """Run the determinism self-test (alone vs batched, chunked prefill, greedy and seeded,
    token ids + logits bits + logprobs, replay) and print its report. Exit 1 on failure."""
    from verinfer.engine.backends import EngineChoice
    from verinfer.engine.loader import resolve_model_path
    from verinfer.engine.selftest import run_selftest
    from verinfer.errors import VerinferError

    try:
        choice = EngineChoice(backend, kernels, threads, max_seqs, export_dir, device=device)
        engine = choice.load(resolve_model_path(model))
    except (VerinferError, ImportError) as e:  # ImportError: vLLM is not installed
        raise fail(str(getattr(e, "message", e))) from e
    try:
        report = run_selftest(engine)
    finally:
        engine.close()
    if out is not None:
        report.save(out)
    doc = report.to_json()
    typer.echo(
        json.dumps(
            {
                **report.summary(),
                "backend": report.backend,
                "seconds": report.seconds,
                "cases": [
                    f"{'ok  ' if c['passed'] else 'FAIL'} {c['name']}"
                    + (f": {c['detail']}" if c["detail"] else "")
                    for c in doc["cases"]
                ],
            },
            indent=2,
        )
    )
    if not report.passed:
        raise typer.Exit(1)
