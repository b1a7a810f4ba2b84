"""`verinfer operator serve` (alias `verinfer serve`): the OpenAI-compatible API.

Everything heavy (the engine, torch, uvicorn, web3) is imported inside :func:`serve`, so that
`verinfer operator --help` and the other operator commands start without it.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from verinfer.cli_errors import fail
from verinfer.engine.backends import BACKENDS, EngineChoice
from verinfer.errors import VerinferError

if TYPE_CHECKING:
    from verinfer.engine.engine import Engine

ModelsOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--model",
        help="A model to serve, repeatable: a name (gemma3-270m, smollm2-135m-instruct: "
        "models shipped as PyPI packages) or a .gguf/.safetensors path. A request's "
        "`model` picks one. Default: gemma3-270m.",
    ),
]
KernelsOpt = Annotated[str, typer.Option("--kernels", help="invariant | fast")]


def _model_path(model: str | None) -> Path:
    from verinfer.engine.loader import embedded_model_path, resolve_model_path

    return resolve_model_path(model) if model else embedded_model_path()


def serve(
    model: ModelsOpt = None,
    host: Annotated[str, typer.Option()] = "127.0.0.1",
    port: Annotated[int, typer.Option()] = 8000,
    kernels: KernelsOpt = "invariant",
    max_seqs: Annotated[int, typer.Option(help="Sequences decoded together.")] = 16,
    max_context: Annotated[int, typer.Option(help="Context limit served.")] = 8192,
    device: Annotated[
        str,
        typer.Option(help="own: cpu (C++ kernels) | cuda (Triton kernels, docs/gpu.md; the "
                     "self-test must pass before signing)."),
    ] = "cpu",
    name: Annotated[
        str | None,
        typer.Option(help="Model name clients send (one --model only; default: the model's name)."),
    ] = None,
    api_keys_file: Annotated[
        Path | None,
        typer.Option(
            help="File with one API key per line (else $VERINFER_API_KEYS, comma-separated); "
            "none = open API."
        ),
    ] = None,
    rate_limit: Annotated[
        float | None, typer.Option(help="Requests per minute per API key (or per client address).")
    ] = None,
    operator_dir: Annotated[
        Path | None,
        typer.Option(
            help="Operator state directory (from `verinfer operator init`): signs a receipt for "
            "every response and publishes the evidence."
        ),
    ] = None,
    unsafe_no_evidence: Annotated[
        bool,
        typer.Option(help="Serve without receipts or published evidence (nothing is verifiable)."),
    ] = False,
    unsafe_dev: Annotated[
        bool,
        typer.Option(
            help="Allow production-unsafe operator modes (no chain, zero verifyingContract, a "
            "locally provisioned KMS): demos and tests only."
        ),
    ] = False,
    unsafe_skip_identity_check: Annotated[
        bool,
        typer.Option(
            hidden=True,
            help="Sign even while the model or engine fingerprint is not approved "
            "on chain (tests that play a careless operator).",
        ),
    ] = False,
    backend: Annotated[
        str,
        typer.Option(
            help="Engine backend: own (the invariant CPU engine) | vllm (one --model, a .gguf; "
            "needs scripts/ci-extras.d/30-vllm or a CUDA vLLM, docs/backends.md)."
        ),
    ] = "own",
    vllm_export_dir: Annotated[
        Path | None,
        typer.Option(
            help="vllm: the `verinfer model export-hf` folder (default: exported into the "
            "cache on first use)."
        ),
    ] = None,
    vllm_threads: Annotated[int, typer.Option(help="vllm: CPU threads.")] = 1,
    trusted_proxy: Annotated[
        list[str] | None,
        typer.Option(
            "--trusted-proxy",
            help="A proxy (address or network) whose X-Forwarded-For is believed, repeatable. "
            "Default: none (the client address is the TCP peer's, whatever headers say).",
        ),
    ] = None,
    max_request_tokens: Annotated[
        int | None,
        typer.Option(
            help="Most engine tokens (prompt + max_tokens, times every prompt and choice) one "
            "request may ask for; more: 503. Default: 4 x --max-context.",
        ),
    ] = None,
    max_queued_tokens: Annotated[
        int | None,
        typer.Option(
            help="Most engine tokens all requests in progress may hold; more: 503 with "
            "Retry-After. Default: 8 x --max-context.",
        ),
    ] = None,
    max_connections: Annotated[
        int, typer.Option(help="Open connections; past it requests get 503.")
    ] = 512,
    body_deadline: Annotated[
        float, typer.Option(help="Seconds a request body may take to arrive; past it: 408.")
    ] = 30.0,
    selftest: Annotated[
        bool | None,
        typer.Option(
            "--selftest/--no-selftest",
            help="Run the determinism self-test before signing (a failed one stops signing; the "
            "report is kept in the operator directory). Default: on for vllm and for "
            "--device cuda, off for own on the CPU (its kernels are invariant by "
            "construction, tested in CI).",
        ),
    ] = None,
) -> None:
    """Serve the OpenAI-compatible API."""
    from verinfer.httpserve import ServeLimits, serve_app
    from verinfer.operator.app import MAX_BODY_BYTES, ServerConfig, create_app

    try:
        limits = ServeLimits(max_body_bytes=MAX_BODY_BYTES, body_deadline_s=body_deadline,
                             max_connections=max_connections)
    except ValueError as e:
        raise fail(str(e)) from e
    if any(t is not None and t < 1 for t in (max_request_tokens, max_queued_tokens)) or (
        max_request_tokens and max_queued_tokens and max_request_tokens > max_queued_tokens
    ):
        raise fail("--max-request-tokens and --max-queued-tokens must be >= 1, the first at most "
                   "the second")
    keys = [k.strip() for k in os.environ.get("VERINFER_API_KEYS", "").split(",") if k.strip()]
    if api_keys_file is not None:
        keys = [k.strip() for k in api_keys_file.read_text().splitlines() if k.strip()]
    wanted = list(model or ["gemma3-270m"])
    if name is not None and len(wanted) > 1:
        raise fail("--name applies to a single --model (named models keep their names)")
    if (operator_dir is None) == (not unsafe_no_evidence):
        raise fail(
            "pass --operator-dir DIR (see `verinfer operator init`) or, to serve "
            "without any verifiable evidence, --unsafe-no-evidence"
        )
    if backend not in BACKENDS:
        raise fail(f"unknown --backend {backend!r} ({' | '.join(BACKENDS)})")
    if backend == "vllm" and len(wanted) != 1:
        raise fail("--backend vllm serves one --model (one vLLM engine per process)")
    try:
        choice = EngineChoice(
            backend, kernels, vllm_threads, max_seqs, vllm_export_dir, max_context, device
        )
    except VerinferError as e:
        raise fail(e) from e
    engines = _engines(choice, wanted, name)
    runtime = None
    unsafe = (
        ["no evidence: responses carry no receipt and nothing is published"]
        if unsafe_no_evidence
        else []
    )
    if operator_dir is not None:
        from verinfer.operator.config import OperatorConfig
        from verinfer.operator.runtime import build_runtime, unsafe_reasons

        try:
            cfg = OperatorConfig.load(operator_dir)
            unsafe = unsafe_reasons(cfg)
            if unsafe and not unsafe_dev:
                for eng in engines.values():
                    eng.close()
                raise fail(
                    "this operator configuration is unsafe for production:\n  - "
                    + "\n  - ".join(unsafe)
                    + "\nconfigure a chain (`operator init "
                    "--rpc-url --deployment --epochs-file`) or pass --unsafe-dev for a "
                    "demo"
                )
            runtime = build_runtime(
                cfg,
                list(engines.values()),
                check_identity=not unsafe_skip_identity_check,
                # a GPU's bits are measured, not assumed: the self-test gates signing there
                selftest=(selftest if selftest is not None
                          else backend == "vllm" or device != "cpu"),
            )
        except VerinferError as e:
            for eng in engines.values():
                eng.close()
            raise fail(e, exit_code=2) from e
    for reason in unsafe:
        typer.echo(f"WARNING: UNSAFE MODE: {reason}", err=True)
    for served_name, eng in engines.items():
        typer.echo(
            f"serving {served_name} (0x{eng.model_id.hex()[:16]}…) on "
            f"http://{host}:{port}/v1 "
            f"[{eng.fingerprint.system_fingerprint}]",
            err=True,
        )
    try:
        config = ServerConfig(
            api_keys=keys,
            rate_limit_per_minute=rate_limit,
            evidence=runtime.evidence if runtime else None,
            readiness=runtime.readiness if runtime else None,
            unsafe=unsafe,
            http_limits=limits,
            max_request_tokens=max_request_tokens,
            max_queued_tokens=max_queued_tokens,
            claim_counts=runtime.claims.counts if runtime and runtime.claims else None,
            receipt_index=runtime.receipt_index if runtime else None,
        )
        serve_app(create_app(engines, None, config), host, port, limits,
                  trusted_proxies=trusted_proxy or ())
    finally:
        if runtime is not None:
            runtime.close()
        for eng in engines.values():
            eng.close()


def _engines(choice: EngineChoice, wanted: list[str], name: str | None) -> dict[str, Engine]:
    """One engine per --model through the backend dispatch, by served name (a shipped model
    keeps its name, a file gets its model's); a clear error (exit 2) when one cannot start."""
    from verinfer.engine.loader import MODEL_NAMES

    engines: dict[str, Engine] = {}
    try:
        for m in wanted:
            try:
                eng = choice.load(_model_path(m))
            except (VerinferError, ImportError) as e:  # ImportError: vLLM is not installed
                raise fail(f"{m}: {getattr(e, 'message', str(e))}") from e
            served = name or (m if m in MODEL_NAMES else _default_name(eng.loaded.name))
            if served in engines:
                eng.close()
                raise fail(f"two models would be served as {served!r}")
            engines[served] = eng
    except typer.Exit:
        for started in engines.values():
            started.close()
        raise
    return engines


def _default_name(model_name: str) -> str:
    return model_name.lower().replace(" ", "-")
