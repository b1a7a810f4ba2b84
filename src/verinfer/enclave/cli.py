"""`verinfer enclave ...`: the SoftwareEnclave (NOT a security boundary) and its tools."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Annotated, Any

import typer

app = typer.Typer(help="Software enclave (not a security boundary): attestation root, "
                       "measurements, key-release runs.", no_args_is_help=True)


def _fail(e: Exception) -> typer.Exit:
    typer.echo(f"error: {getattr(e, 'message', e)}", err=True)
    return typer.Exit(2)


@app.command("root-keygen")
def root_keygen_cmd(out: Annotated[Path, typer.Option(help="Writes root.key and root.pub.")]
                    ) -> None:
    """Create a SoftwareEnclave attestation root key pair; shards pin root.pub."""
    from verinfer.enclave.errors import RootKeyError
    from verinfer.enclave.software import root_keygen

    try:
        pub = root_keygen(out / "root.key", out / "root.pub")
    except RootKeyError as e:
        raise _fail(e) from e
    typer.echo(pub.hex())


ContainerOpt = Annotated[str, typer.Option(help="Container image digest (sha256:…).")]
CodeOpt = Annotated[str, typer.Option(help="Hash of the enclave code.")]
FingerprintOpt = Annotated[str, typer.Option(help="Engine fingerprint string.")]


@app.command()
def measure(container_digest: ContainerOpt, code_hash: CodeOpt,
            engine_fingerprint: FingerprintOpt) -> None:
    """Print the measurement (hex) to put on the allowlist."""
    from verinfer.enclave.attestation import measurement

    typer.echo("0x" + measurement(container_digest, code_hash, engine_fingerprint).hex())


def _jsonable(v: Any) -> Any:
    if isinstance(v, bytes | bytearray):
        return "0x" + bytes(v).hex()
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

    from verinfer.enclave.attestation import measurement
    from verinfer.enclave.jobs import resolve_job
    from verinfer.enclave.runner import AccountSigner, EnclaveRunner
    from verinfer.enclave.software import SoftwareAttester, load_root_private
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
        raise _fail(e) from e
    typer.echo(json.dumps({"result": _jsonable(out.result), "shards_used": out.shards_used,
                           "corrupt_shards": out.corrupt_shards,
                           "refusals": {str(k): v for k, v in out.refusals.items()},
                           "key_ms": round(out.key_ms, 2)}))
