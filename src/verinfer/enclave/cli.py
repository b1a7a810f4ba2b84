"""`verinfer enclave ...`: the SoftwareEnclave (NOT a security boundary) and its tools, and
Intel TDX quote verification (`verify-quote`)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Annotated, Any

import typer

from verinfer.cli_errors import fail
from verinfer.protocol.hexutil import to_hex

app = typer.Typer(help="Software enclave (not a security boundary): attestation root, "
                       "measurements, key-release runs; TDX quote verification.",
                  no_args_is_help=True)


@app.command("root-keygen")
def root_keygen_cmd(out: Annotated[Path, typer.Option(help="Writes root.key and root.pub.")]
                    ) -> None:
    """Create a SoftwareEnclave attestation root key pair; shards pin root.pub."""
    from verinfer.attestation.errors import RootKeyError
    from verinfer.attestation.software import root_keygen

    try:
        pub = root_keygen(out / "root.key", out / "root.pub")
    except RootKeyError as e:
        raise fail(e, exit_code=2) from e
    typer.echo(pub.hex())


ContainerOpt = Annotated[str, typer.Option(help="Container image digest (sha256:…).")]
CodeOpt = Annotated[str, typer.Option(help="Hash of the enclave code.")]
FingerprintOpt = Annotated[str, typer.Option(help="Engine fingerprint string.")]


@app.command()
def measure(container_digest: ContainerOpt, code_hash: CodeOpt,
            engine_fingerprint: FingerprintOpt) -> None:
    """Print the measurement (hex) to put on the allowlist."""
    from verinfer.attestation.quotes import measurement

    typer.echo(to_hex(measurement(container_digest, code_hash, engine_fingerprint)))


def _jsonable(v: Any) -> Any:
    if isinstance(v, bytes | bytearray):
        return to_hex(bytes(v))
    if isinstance(v, dict):
        return {str(k): _jsonable(x) for k, x in v.items()}
    if isinstance(v, list | tuple):
        return [_jsonable(x) for x in v]
    return v


@app.command()
def run(
    root_key: Annotated[Path, typer.Option(help="Attestation root private key file.")],
    container_digest: ContainerOpt, code_hash: CodeOpt, engine_fingerprint: FingerprintOpt,
    directory: Annotated[Path, typer.Option(help="shards.json")],
    registry: Annotated[Path, typer.Option(help="epochs.json")],
    epoch: Annotated[int, typer.Option()],
    challenge_id: Annotated[str, typer.Option()],
    requester_key: Annotated[Path, typer.Option(help="File with the verifier's hex private "
                                                     "key (signs the request).")],
    job: Annotated[str, typer.Option(help="module:function, called f(private_key, **args).")],
    job_args: Annotated[str, typer.Option(help="JSON object; strings '0x…' stay strings.")]
    = "{}",
    purpose: Annotated[str, typer.Option(help="full_challenge | light_audit")]
    = "full_challenge",
) -> None:
    """Be the enclave process: obtain the epoch key from t shards, run the job, wipe, print
    the job result and which shards answered as JSON."""
    from eth_account import Account

    from verinfer.attestation.quotes import measurement
    from verinfer.attestation.software import SoftwareAttester, load_root_private
    from verinfer.enclave.jobs import resolve_job
    from verinfer.enclave.runner import AccountSigner, EnclaveRunner
    from verinfer.errors import VerinferError
    from verinfer.kms.directory import load_directory
    from verinfer.kms.epochs import FileEpochRegistry

    try:
        args = json.loads(job_args)
        if not isinstance(args, dict):
            raise ValueError("--job-args must be a JSON object")
        acct = Account.from_key(requester_key.read_text().strip())
        attester = SoftwareAttester(
            load_root_private(root_key),
            measurement(container_digest, code_hash, engine_fingerprint), time.time)
        runner = EnclaveRunner(attester=attester, shards=load_directory(directory),
                               epochs=FileEpochRegistry(registry), signer=AccountSigner(acct))
        fn = resolve_job(job)
        out = runner.run(lambda key: fn(key, **args), epoch=epoch, purpose=purpose,
                         challenge_id=challenge_id)
    except (VerinferError, ValueError, OSError) as e:
        raise fail(e, exit_code=2) from e
    typer.echo(json.dumps({"result": _jsonable(out.result), "shards_used": out.shards_used,
                           "corrupt_shards": out.corrupt_shards,
                           "refusals": {str(k): v for k, v in out.refusals.items()},
                           "key_ms": round(out.key_ms, 2)}))


@app.command("verify-quote")
def verify_quote_cmd(
    quote: Annotated[Path, typer.Option(help="Raw TDX quote (binary, as the TD produced it).")],
    collateral: Annotated[Path, typer.Option(
        help="Its collateral: QuoteCollateralV3 JSON (PCK CRL, root CA CRL, TCB info, QE "
             "identity with chains and signatures).")],
    now: Annotated[int | None, typer.Option(
        help="Unix time to verify at (default: the clock).")] = None,
    policy: Annotated[Path | None, typer.Option(
        help="TDX policy JSON (TCB statuses, advisories, platforms, measurements). Without "
             "it: Intel's chain, TCB UpToDate and the debug bit only (inspection).")] = None,
    event_log: Annotated[Path | None, typer.Option(
        help='RTMR3 event log JSON: [{"name": str, "payload": str}, …] in extension order '
             "(default: empty).")] = None,
    report_data: Annotated[str | None, typer.Option(
        help="Expected report_data, 64 bytes hex (the KMS request binding).")] = None,
    kms_request: Annotated[Path | None, typer.Option(
        help="A KMS release request JSON: expect its report_data binding.")] = None,
) -> None:
    """Verify an Intel TDX quote against Intel's root with its collateral; print one JSON
    object (ok, tee, tcb_status, advisory_ids, mrtd, rtmr0..3, report_data, measurement, or
    reason and message); exit 1 when refused, 2 on unusable arguments."""
    from verinfer.attestation.errors import AttestationError
    from verinfer.attestation.tdx import TEE, TdxEvidence, TdxPolicy, verify_tdx
    from verinfer.errors import VerinferError
    from verinfer.protocol.jsonsafe import loads_untrusted

    try:
        pol = TdxPolicy.load(policy) if policy is not None else TdxPolicy()
        events: list[tuple[str, bytes]] = []
        if event_log is not None:
            items = loads_untrusted(event_log.read_bytes(), max_bytes=1024 * 1024, depth=3,
                                    what=f"event log {event_log}")
            if not isinstance(items, list) or not all(
                    isinstance(e, dict) and isinstance(e.get("name"), str)
                    and isinstance(e.get("payload"), str) for e in items):
                raise ValueError('event log must be [{"name": str, "payload": str}, …]')
            events = [(e["name"], e["payload"].encode()) for e in items]
        expected: bytes | None = None
        if report_data is not None and kms_request is not None:
            raise ValueError("--report-data and --kms-request exclude each other")
        if report_data is not None:
            from verinfer.protocol.hexutil import parse_hex_lenient

            # typed on the command line: 0x optional; a HexFormatError is a ValueError, as before
            expected = parse_hex_lenient(report_data, 64, "--report-data")
        elif kms_request is not None:
            from verinfer.kms.protocol import ReleaseRequest

            expected = ReleaseRequest.from_json(loads_untrusted(
                kms_request.read_bytes(), max_bytes=256 * 1024, depth=8,
                what=f"KMS request {kms_request}")).report_data()
        if expected is not None:
            from dataclasses import replace

            pol = replace(pol, expected_report_data=expected)
        evidence = TdxEvidence(quote.read_bytes(), collateral.read_bytes(), tuple(events))
        at = int(time.time()) if now is None else now
    except (VerinferError, ValueError, OSError) as e:
        raise fail(e, exit_code=2) from e
    try:
        result = verify_tdx(evidence, now=at, policy=pol)
    except AttestationError as e:
        typer.echo(json.dumps({"ok": False, "tee": TEE, "reason": e.code, "message": e.message,
                               "now": at}))
        raise typer.Exit(1) from e
    typer.echo(json.dumps({**result.to_json(), "now": at}))
