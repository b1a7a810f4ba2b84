"""`verinfer kms ...`: key epochs and shard servers. Heavy imports stay inside the commands."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Annotated

import typer

from verinfer.cli_errors import fail

app = typer.Typer(help="Threshold KMS: key epochs and shard servers.", no_args_is_help=True)
shard_app = typer.Typer(help="Run a KMS shard.", no_args_is_help=True)
app.add_typer(shard_app, name="shard")

RegistryOpt = Annotated[Path, typer.Option("--registry", help="Epoch registry (epochs.json).")]


@app.command()
def keygen(
    epoch: Annotated[int, typer.Option(help="Epoch number to create.")],
    threshold: Annotated[int, typer.Option(help="t: shares needed to rebuild the key.")],
    shares: Annotated[int, typer.Option(help="n: number of shards.")],
    out: Annotated[Path, typer.Option(help="Writes out/shard-<i>/epoch-<N>.share.sealed.")],
    seal_keys: Annotated[Path, typer.Option(
        help="Directory of per-shard seal keys shard-<i>.key (created if missing). Keep it "
             "apart from --out: a share and its seal key together are the share.")],
    registry: RegistryOpt = Path("epochs.json"),
    suite: Annotated[str, typer.Option(
        help="HPKE suite of the app key (default p256-hkdf-sha256-aes128gcm: per-receipt "
             "decryption, the key is never rebuilt; x25519-…/mlkem768x25519-… are rebuilt "
             "in the enclave, docs/kms.md §8).")] = "",
) -> None:
    """Create a key epoch: draw s, split t-of-n, seal each share, register the public part."""
    from verinfer.errors import VerinferError
    from verinfer.kms.app_keys import DEFAULT_SUITE
    from verinfer.kms.epochs import FileEpochRegistry
    from verinfer.kms.keygen import keygen as run_keygen
    from verinfer.kms.sealing import load_seal_key, new_seal_key

    if seal_keys.resolve().is_relative_to(out.resolve()):
        typer.echo(f"warning: seal keys in {seal_keys} sit under the share directory {out}; "
                   "move them to the shard hosts", err=True)
    try:
        keys = {}
        for i in range(1, shares + 1):
            p = seal_keys / f"shard-{i}.key"
            keys[i] = load_seal_key(p) if p.exists() else new_seal_key(p)
        rec = run_keygen(epoch=epoch, threshold=threshold, shares=shares, out=out,
                         seal_keys=keys, registry=FileEpochRegistry(registry),
                         suite=suite or DEFAULT_SUITE, now=time.time)
    except VerinferError as e:
        raise fail(e, exit_code=2) from e
    typer.echo(json.dumps(rec.to_json(), indent=2))


@app.command()
def retire(epoch: Annotated[int, typer.Option()], registry: RegistryOpt = Path("epochs.json")
           ) -> None:
    """Retire an epoch: every shard refuses it from now on."""
    from verinfer.errors import VerinferError
    from verinfer.kms.epochs import FileEpochRegistry

    try:
        rec = FileEpochRegistry(registry).retire(epoch, int(time.time()))
    except VerinferError as e:
        raise fail(e, exit_code=2) from e
    typer.echo(json.dumps(rec.to_json()))


@app.command()
def epochs(registry: RegistryOpt = Path("epochs.json")) -> None:
    """List registered epochs."""
    from verinfer.kms.epochs import FileEpochRegistry

    for rec in FileEpochRegistry(registry).all():
        typer.echo(f"{rec.epoch}\t{rec.status}\t{rec.threshold}-of-{rec.shares}\t{rec.suite}")


@app.command("verify-log")
def verify_log(
    path: Path,
    heads: Annotated[Path | None, typer.Option(
        help="Signed heads file (default: <log>.heads.jsonl next to the log; checked if it "
             "exists).")] = None,
    head: Annotated[list[Path] | None, typer.Option(
        help="A signed head obtained elsewhere (JSON file, e.g. saved from the shard's "
             "GET /v1/log/head); repeatable. The log must extend each.")] = None,
    address: Annotated[str | None, typer.Option(
        help="The shard's address (shards.json): every head must be signed by it.")] = None,
    published: Annotated[list[str] | None, typer.Option(
        help="Published heads (kms/log_publish.py): a publication transaction hash or the "
             "publisher's index file; repeatable. Needs --address, --rpc-url and the DA "
             "store the bundles are on.")] = None,
    rpc_url: Annotated[str, typer.Option(help="With --published.")] = "http://127.0.0.1:8545",
    da_store: Annotated[str | None, typer.Option(help="With --published: local DA store.")]
    = None,
    da_redis_url: Annotated[str | None, typer.Option(help="With --published: Redis DA.")]
    = None,
) -> None:
    """Check a release log's hash chain and that it extends every signed head.

    Exit 2 with the named reason (truncated_below_signed_head, diverges_from_signed_head,
    entry_hash_mismatch, chain_broken, head_signature_invalid, ...) otherwise."""
    from verinfer.kms.release_log import (
        ReleaseLogError,
        SignedHead,
        heads_path,
        read_heads,
        verify_release_log,
    )
    from verinfer.protocol.jsonsafe import UntrustedJsonError, loads_untrusted

    try:
        signed = read_heads(heads or heads_path(path))
        for p in head or []:
            try:
                signed.append(SignedHead.from_json(loads_untrusted(
                    p.read_bytes(), max_bytes=16 * 1024, depth=4, what=str(p))))
            except UntrustedJsonError as e:
                raise ReleaseLogError("head_malformed", e.message) from e
        if published:
            from verinfer.kms.log_publish import LogPublicationError, published_heads_cli

            if address is None:
                raise fail("--published needs --address (the shard's identity)", exit_code=2)
            try:
                signed += published_heads_cli(published, address, rpc_url, da_store,
                                              da_redis_url)
            except LogPublicationError as e:
                typer.echo(json.dumps({"ok": False, "reason": e.reason, "message": e.message}))
                raise fail(e, exit_code=2) from e
        n, last = verify_release_log(path, heads=signed, address=address)
    except ReleaseLogError as e:
        typer.echo(json.dumps({"ok": False, "reason": e.reason, "message": e.message}))
        raise fail(e, exit_code=2) from e
    typer.echo(json.dumps({"ok": True, "entries": n, "head": last,
                           "signed_heads_checked": len(signed),
                           "signed_count": max((h.count for h in signed), default=0)}))


SealKeyFile = Annotated[Path | None, typer.Option(help="Seal keyfile (hex).")]
SealKeyEnv = Annotated[str, typer.Option(help="Env var with the seal key if no keyfile.")]


@app.command("publish-heads")
def publish_heads(
    directory: Annotated[Path, typer.Option(help="shards.json (urls and addresses).")],
    private_key_env: Annotated[str, typer.Option(
        help="Environment variable holding the publishing account's hex key.")],
    rpc_url: Annotated[str, typer.Option()] = "http://127.0.0.1:8545",
    da_store: Annotated[str | None, typer.Option(help="Local DA store.")] = None,
    da_redis_url: Annotated[str | None, typer.Option(help="Redis DA.")] = None,
    index: Annotated[Path | None, typer.Option(
        help="Append each publication (tx, pointer) to this JSON-lines file.")] = None,
    interval_s: Annotated[float, typer.Option(
        help="Publish every this many seconds; 0: once.")] = 0.0,
) -> None:
    """Publish every shard's signed release-log head: bundle on DA, hash + pointer on chain."""
    from verinfer.kms.log_publish import publisher_cli

    try:
        publisher_cli(directory, private_key_env, rpc_url, da_store, da_redis_url, index,
                      interval_s, lambda m: typer.echo(m))
    except Exception as e:  # typed errors and config mistakes: one line, exit 2
        raise fail(e, exit_code=2) from e


@shard_app.command("init")
def shard_init(
    index: Annotated[int, typer.Option()],
    data_dir: Annotated[Path, typer.Option()],
    url: Annotated[str, typer.Option(help="URL enclaves will use for this shard.")],
    directory: Annotated[Path, typer.Option(help="shards.json to add this shard to.")],
    seal_key_file: SealKeyFile = None,
    seal_key_env: SealKeyEnv = "VERINFER_KMS_SEAL_KEY",
) -> None:
    """Create (or load) the shard's identity key and list it in the shard directory."""
    from verinfer.errors import VerinferError
    from verinfer.kms.directory import ShardInfo, upsert_shard
    from verinfer.kms.identity import load_or_create_identity
    from verinfer.kms.sealing import load_seal_key

    try:
        acct = load_or_create_identity(data_dir, index, load_seal_key(seal_key_file,
                                                                      seal_key_env))
        upsert_shard(directory, ShardInfo(index, url.rstrip("/"), acct.address.lower()))
    except VerinferError as e:
        raise fail(e, exit_code=2) from e
    typer.echo(acct.address)


@shard_app.command("serve")
def shard_serve(
    index: Annotated[int, typer.Option()],
    port: Annotated[int, typer.Option()],
    data_dir: Annotated[Path, typer.Option()],
    allowlist: Annotated[Path, typer.Option(help="Measurement allowlist JSON.")],
    attestation_root: Annotated[list[Path] | None, typer.Option(
        help="Pinned SoftwareEnclave root public key file (repeatable; with "
             "--allow-insecure-software-enclave).")] = None,
    rpc_url: Annotated[str | None, typer.Option(
        help="Chain JSON-RPC URL: read committees and verifiers from the deployed contracts "
             "(with --deployment). The production committee source.")] = None,
    deployment: Annotated[Path | None, typer.Option(
        help="deployment.json of the contracts (with --rpc-url).")] = None,
    committee: Annotated[Path | None, typer.Option(
        help="Committee/verifier JSON instead of the chain (tests, offline use only: whoever "
             "can write it decides who gets shares).")] = None,
    registry: RegistryOpt = Path("epochs.json"),
    host: Annotated[str, typer.Option()] = "127.0.0.1",
    seal_key_file: SealKeyFile = None,
    seal_key_env: SealKeyEnv = "VERINFER_KMS_SEAL_KEY",
    release_log: Annotated[Path | None, typer.Option(
        help="Default: <data-dir>/release-log.jsonl")] = None,
    nonce_ttl: Annotated[float, typer.Option(help="Nonce lifetime, seconds.")] = 30.0,
    quote_max_age: Annotated[float, typer.Option(help="Max quote age, seconds.")] = 60.0,
    rate_capacity: Annotated[float, typer.Option(help="Token bucket size per requester.")] = 10,
    rate_refill: Annotated[float, typer.Option(help="Tokens per second per requester.")] = 1.0,
    checkpoint_every: Annotated[int, typer.Option(
        help="Sign and append a release-log head every N entries (also at start and "
             "shutdown).")] = 100,
    head_interval: Annotated[float, typer.Option(
        help="GET /v1/log/head signs a new head at most this often (seconds); in between it "
             "answers the last one.")] = 10.0,
    source_rate_capacity: Annotated[float, typer.Option(
        help="POST /v1/release and /v1/decrypt: token bucket size per source address.")]
    = 60.0,
    source_rate_refill: Annotated[float, typer.Option(
        help="Tokens per second per source address.")] = 20.0,
    max_connections: Annotated[int, typer.Option(
        help="Concurrent connections before the server answers 503 (uvicorn "
             "limit_concurrency).")] = 256,
    body_deadline: Annotated[float, typer.Option(
        help="Seconds for a whole request body to arrive after its headers (else 408).")]
    = 60.0,
    tee: Annotated[list[str] | None, typer.Option(
        help="Accepted TEE(s): 'tdx' or 'software' for every epoch, 'EPOCH=tdx,software' for "
             "one (repeatable; docs/attestation.md).")] = None,
    tdx_policy: Annotated[Path | None, typer.Option(
        help="TDX policy JSON (TCB statuses, platforms MRTD/RTMR0-2); needed for --tee tdx.")]
    = None,
    allow_insecure_software_enclave: Annotated[bool, typer.Option(
        help="Accept SoftwareEnclave quotes: NOT a security boundary (devnet, tests).")]
    = False,
    audit_scheduler: Annotated[list[str] | None, typer.Option(
        help="Address whose signed audit assignments authorize per-receipt light audits "
             "(repeatable; none: per-receipt light audits only from the committee source).")]
    = None,
) -> None:
    """Serve one shard over HTTP (nonce, release, health, metrics).

    The committee source is either the chain (--rpc-url and --deployment) or a file
    (--committee): exactly one."""
    from verinfer.attestation.software import load_root_public
    from verinfer.attestation.tee_gate import build_tee_gate
    from verinfer.errors import VerinferError
    from verinfer.httpserve import serve_app
    from verinfer.kms.allowlist import FileMeasurementAllowlist
    from verinfer.kms.committee import CommitteeOracle, FileCommitteeOracle
    from verinfer.kms.epochs import FileEpochRegistry
    from verinfer.kms.identity import load_or_create_identity
    from verinfer.kms.release_log import ReleaseLog, ReleaseLogError
    from verinfer.kms.sealing import load_seal_key
    from verinfer.kms.shard import ShardConfig, ShardService
    from verinfer.kms.shard_app import create_app, serve_limits

    chain = rpc_url is not None or deployment is not None
    problem = None
    if chain and committee is not None:
        problem = "--committee excludes --rpc-url/--deployment: give one committee source"
    elif not chain and committee is None:
        problem = ("no committee source: give --rpc-url URL --deployment FILE (the chain) or "
                   "--committee FILE (tests, offline)")
    elif chain and (rpc_url is None or deployment is None):
        problem = "--rpc-url and --deployment go together"
    if problem:
        raise fail(problem, exit_code=2)
    try:
        oracle: CommitteeOracle
        if committee is not None:
            oracle = FileCommitteeOracle(committee)
        else:
            from verinfer.kms.chain_oracle import ChainCommitteeOracle

            assert rpc_url is not None and deployment is not None
            chain_oracle = ChainCommitteeOracle.connect(rpc_url, deployment)
            chain_oracle.check()
            oracle = chain_oracle
        seal_key = load_seal_key(seal_key_file, seal_key_env)
        identity = load_or_create_identity(data_dir, index, seal_key)
        try:
            # Refuses a log that does not extend the shard's own last signed head.
            rlog = ReleaseLog(release_log or data_dir / "release-log.jsonl", signer=identity,
                              shard_index=index, checkpoint_every=checkpoint_every,
                              head_interval_s=head_interval)
        except ReleaseLogError as e:
            raise fail(f"release log does not verify ({e.reason}); refusing to start: "
                       f"{e.message}", exit_code=2) from e
        try:  # which TEEs this shard accepts (attestation/tee_gate.py)
            gate = build_tee_gate(tees=tee or [], tdx_policy=tdx_policy,
                                  allow_insecure_software_enclave=allow_insecure_software_enclave)
            if allow_insecure_software_enclave and not attestation_root:
                raise ValueError("--allow-insecure-software-enclave needs --attestation-root")
        except ValueError as e:
            raise fail(e, exit_code=2) from e
        cfg = ShardConfig(
            index=index, data_dir=data_dir, seal_key=seal_key, identity=identity,
            epochs=FileEpochRegistry(registry),
            quote_verifier=gate,
            allowlist=FileMeasurementAllowlist(allowlist),
            software_roots=frozenset(load_root_public(p) for p in attestation_root or []),
            committee=oracle,
            release_log=rlog,
            now=time.time, nonce_ttl_s=nonce_ttl, quote_max_age_s=quote_max_age,
            rate_capacity=rate_capacity, rate_refill_per_s=rate_refill,
            audit_schedulers=frozenset(a.lower() for a in audit_scheduler or []))
    except VerinferError as e:
        raise fail(e, exit_code=2) from e
    service = ShardService(cfg)
    source = f"chain {rpc_url} ({deployment})" if chain else f"file {committee}"
    print(f"kms shard {index} ({service.address}) on http://{host}:{port}, committee from "
          f"{source}", file=sys.stderr, flush=True)
    if gate.insecure_software_enclave:
        print(f"kms shard {index}: WARNING --allow-insecure-software-enclave: SoftwareEnclave "
              "quotes (no security boundary) can obtain shares", file=sys.stderr, flush=True)
    # verinfer.httpserve: header deadline, keep-alive, connection cap, and the app's BodyGuard
    # (body deadline, bodies in progress) with the same limits (docs/budgets.md, KMS shard)
    limits = serve_limits(max_connections=max_connections, body_deadline_s=body_deadline)
    serve_app(create_app(service, source_rate_capacity=source_rate_capacity,
                         source_rate_refill_per_s=source_rate_refill, limits=limits),
              host, port, limits)
