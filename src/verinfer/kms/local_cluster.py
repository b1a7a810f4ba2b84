"""A local KMS cluster on loopback: files laid out by ``provision``, one OS process per shard
(``verinfer kms shard serve``). Used by tests, the benchmark and the devnet.

Layout under ``root``: epochs.json, shards.json, allowlist.json, committee.json,
attestation/root.{key,pub} (SoftwareEnclave root; not a security boundary), seal-keys/shard-<i>.key
(kept apart from the shard data), shard-<i>/ (sealed shares, sealed identity, release log).

Committee source of the shards: the chain (``ShardProcesses(lay, chain=ChainSource(rpc,
deployment))``, what the devnet runs) or, by default, the layout's committee.json (tests and
benchmarks without a chain).
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx
from eth_account import Account

from verinfer.attestation.quotes import VerifierSet
from verinfer.attestation.software import SoftwareQuoteVerifier, load_root_public, root_keygen
from verinfer.kms.allowlist import FileMeasurementAllowlist, write_allowlist
from verinfer.kms.app_keys import LEGACY_SUITE
from verinfer.kms.committee import CommitteeOracle, FileCommitteeOracle
from verinfer.kms.directory import ShardInfo, load_directory, upsert_shard
from verinfer.kms.epochs import EpochRecord, FileEpochRegistry
from verinfer.kms.errors import ShardUnavailableError
from verinfer.kms.identity import load_or_create_identity
from verinfer.kms.keygen import keygen, shard_dir
from verinfer.kms.release_log import ReleaseLog
from verinfer.kms.sealing import load_seal_key, new_seal_key
from verinfer.kms.shard import ShardConfig, ShardService
from verinfer.ports import free_ports
from verinfer.protocol.hexutil import to_hex


@dataclass(frozen=True)
class ClusterLayout:
    root: Path
    shares: int

    @property
    def registry(self) -> Path:
        return self.root / "epochs.json"

    @property
    def directory(self) -> Path:
        return self.root / "shards.json"

    @property
    def allowlist(self) -> Path:
        return self.root / "allowlist.json"

    @property
    def committee(self) -> Path:
        return self.root / "committee.json"

    @property
    def root_key(self) -> Path:
        return self.root / "attestation" / "root.key"

    @property
    def root_pub(self) -> Path:
        return self.root / "attestation" / "root.pub"

    @property
    def audit_scheduler_key(self) -> Path:
        """Private key (0x-hex) of the local audit scheduler: its signed assignments
        authorize per-receipt light audits on these shards (``verinfer audit
        --scheduler-key-file``)."""
        return self.root / "audit-scheduler.key"

    def audit_scheduler_address(self) -> str | None:
        if not self.audit_scheduler_key.exists():
            return None
        return str(Account.from_key(self.audit_scheduler_key.read_text().strip()).address)

    def seal_key_file(self, index: int) -> Path:
        return self.root / "seal-keys" / f"shard-{index}.key"

    def data_dir(self, index: int) -> Path:
        return shard_dir(self.root, index)

    def release_log(self, index: int) -> Path:
        return self.data_dir(index) / "release-log.jsonl"

    def server_log(self, index: int) -> Path:
        return self.data_dir(index) / "server.log"

    def shards_info(self) -> list[ShardInfo]:
        return load_directory(self.directory)


def provision(root: Path, *, epoch: int, threshold: int, shares: int,
              measurements: Iterable[bytes], verifiers: Iterable[str] = (),
              challenges: Mapping[str, Sequence[str]] | None = None,
              suite: str | None = None, now: Callable[[], float] = time.time,
              challenge_receipts: Mapping[str, bytes] | None = None,
              audits: Mapping[str, Sequence[bytes]] | None = None,
              unsafe_single_tree: bool = False) -> ClusterLayout:
    """Create seal keys, the attestation root, epoch ``epoch``, shard identities, a shard
    directory with free loopback ports, the allowlist and the committee file (challenges
    listed here are open; ``challenge_receipts`` names the receipt (EIP-712 hashStruct) each
    disputes, ``audits`` the receipt hashes assigned to each light auditor: per-receipt
    decryption).

    Without ``suite`` the epoch is of the legacy share-release suite (most KMS tests exercise
    that path); the devnet passes the per-receipt suite (``verinfer kms keygen``'s default).

    UNSAFE outside devnets and tests: every seal key, every sealed share and the attestation
    root key (which can forge quotes) land in one tree, with a file-based committee; callers
    must say so with ``unsafe_single_tree=True`` (a real KMS runs `verinfer kms keygen`)."""
    if not unsafe_single_tree:
        raise ValueError("provision() puts all seal keys, sealed shares and the attestation "
                         "root key in one tree: pass unsafe_single_tree=True (devnets, tests)")
    lay = ClusterLayout(root, shares)
    root.mkdir(parents=True, exist_ok=True)
    keys = {i: new_seal_key(lay.seal_key_file(i)) for i in range(1, shares + 1)}
    root_keygen(lay.root_key, lay.root_pub)
    keygen(epoch=epoch, threshold=threshold, shares=shares, out=root, seal_keys=keys,
           registry=FileEpochRegistry(lay.registry), now=now, suite=suite or LEGACY_SUITE)
    ports = free_ports(shares)
    for i in range(1, shares + 1):
        acct = load_or_create_identity(lay.data_dir(i), i, keys[i])
        upsert_shard(lay.directory, ShardInfo(i, f"http://127.0.0.1:{ports[i - 1]}",
                                              acct.address.lower()))
    write_allowlist(lay.allowlist, measurements)
    # the light-audit scheduler of this throwaway cluster (another key in the unsafe tree)
    lay.audit_scheduler_key.write_text(to_hex(secrets.token_bytes(32)))
    lay.audit_scheduler_key.chmod(0o600)
    lay.committee.write_text(json.dumps({
        "verifiers": list(verifiers),
        "challenges": {cid: {"status": "open", "committee": list(m),
                             **({"receipt_hash": to_hex(challenge_receipts[cid])}
                                if challenge_receipts and cid in challenge_receipts else {})}
                       for cid, m in (challenges or {}).items()},
        "audits": {v: [to_hex(d) for d in ds] for v, ds in (audits or {}).items()}},
        indent=2))
    return lay


def add_epoch(lay: ClusterLayout, *, epoch: int, threshold: int,
              now: Callable[[], float] = time.time, suite: str | None = None) -> EpochRecord:
    """Rotation: a new epoch for the same shards (same seal keys)."""
    keys = {i: load_seal_key(lay.seal_key_file(i)) for i in range(1, lay.shares + 1)}
    return keygen(epoch=epoch, threshold=threshold, shares=lay.shares, out=lay.root,
                  seal_keys=keys, registry=FileEpochRegistry(lay.registry), now=now,
                  suite=suite or LEGACY_SUITE)


@dataclass(frozen=True)
class ChainSource:
    """Shards read committees and verifiers from this chain (``ChainCommitteeOracle``)."""

    rpc_url: str
    deployment: Path

    def shard_args(self) -> list[str]:
        return ["--rpc-url", self.rpc_url, "--deployment", str(self.deployment)]


class ShardProcesses:
    """Shard servers as child processes; ``stop(i)`` takes one down (SIGTERM).

    ``chain``: the shards' committee source is that chain; without it, ``lay.committee``.
    ``own_session``: each shard in a session of its own (``setsid``), so that a hang-up of the
    starting process's terminal does not reach it: for shards that outlive their starter
    (`verinfer devnet up`); a test's shards stay in its group and die with it."""

    def __init__(self, lay: ClusterLayout, *, chain: ChainSource | None = None,
                 extra_args: Sequence[str] = (), env: Mapping[str, str] | None = None,
                 own_session: bool = False) -> None:
        self.lay = lay
        self.own_session = own_session
        self.chain = chain
        self.extra_args = list(extra_args)
        self.env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
        self.procs: dict[int, subprocess.Popen[bytes]] = {}

    def start(self, indices: Iterable[int] | None = None, timeout_s: float = 180.0) -> None:
        """Starts the shards and waits until each answers /health. Each shard is a Python
        process importing the whole service: five at once on a loaded 2-core machine took over
        60 s, hence the generous deadline. A shard that exits or misses the deadline stops every
        shard this call started (none is left running, unrecorded, behind a failed start) and
        raises ShardUnavailableError."""
        infos = {s.index: s for s in self.lay.shards_info()}
        todo = list(indices) if indices is not None else sorted(infos)
        for i in todo:
            port = int(infos[i].url.rsplit(":", 1)[1])
            cmd = [sys.executable, "-m", "verinfer", "kms", "shard", "serve",
                   "--index", str(i), "--port", str(port),
                   "--data-dir", str(self.lay.data_dir(i)),
                   "--seal-key-file", str(self.lay.seal_key_file(i)),
                   "--registry", str(self.lay.registry),
                   "--attestation-root", str(self.lay.root_pub),
                   "--allow-insecure-software-enclave",  # the software enclave: local only
                   "--allowlist", str(self.lay.allowlist),
                   *self.committee_args(), *self.scheduler_args(), *self.extra_args]
            with self.lay.server_log(i).open("ab") as log:
                self.procs[i] = subprocess.Popen(cmd, env=self.env, stdout=log, stderr=log,
                                                 start_new_session=self.own_session)
        deadline = time.monotonic() + timeout_s
        try:
            for i in todo:
                self._wait_healthy(infos[i], deadline)
        except BaseException:
            for i in todo:
                self.stop(i)
            raise

    def scheduler_args(self) -> list[str]:
        addr = self.lay.audit_scheduler_address()
        return [] if addr is None else ["--audit-scheduler", addr]

    def committee_args(self) -> list[str]:
        if self.chain is not None:
            return self.chain.shard_args()
        return ["--committee", str(self.lay.committee)]

    def _wait_healthy(self, info: ShardInfo, deadline: float) -> None:
        proc = self.procs[info.index]
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                err = self.lay.server_log(info.index).read_text(errors="replace")
                raise ShardUnavailableError(
                    f"shard {info.index} exited with {proc.returncode}: {err[-2000:]}")
            try:
                if httpx.get(info.url + "/health", timeout=1.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise ShardUnavailableError(f"shard {info.index} not healthy at {info.url}")

    def stop(self, index: int) -> None:
        proc = self.procs.pop(index, None)
        if proc is None:
            return
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def stop_all(self) -> None:
        for i in list(self.procs):
            self.stop(i)

    def __enter__(self) -> ShardProcesses:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop_all()


def build_shard_service(lay: ClusterLayout, index: int, *, now: Callable[[], float],
                        nonce_ttl_s: float = 30.0, quote_max_age_s: float = 60.0,
                        rate_capacity: float = 10.0, rate_refill_per_s: float = 1.0,
                        committee: CommitteeOracle | None = None,
                        checkpoint_every: int = 100,
                        audit_schedulers: Iterable[str] = ()) -> ShardService:
    """The same service ``verinfer kms shard serve`` runs, in this process (clock injectable).
    ``committee``: e.g. a ``ChainCommitteeOracle``; default the layout's committee.json."""
    seal_key = load_seal_key(lay.seal_key_file(index))
    identity = load_or_create_identity(lay.data_dir(index), index, seal_key)
    return ShardService(ShardConfig(
        index=index, data_dir=lay.data_dir(index), seal_key=seal_key, identity=identity,
        epochs=FileEpochRegistry(lay.registry),
        quote_verifier=VerifierSet([SoftwareQuoteVerifier()]),
        allowlist=FileMeasurementAllowlist(lay.allowlist),
        software_roots=frozenset({load_root_public(lay.root_pub)}),
        committee=committee if committee is not None else FileCommitteeOracle(lay.committee),
        release_log=ReleaseLog(lay.release_log(index), signer=identity, shard_index=index,
                               checkpoint_every=checkpoint_every, now=now),
        now=now, nonce_ttl_s=nonce_ttl_s, quote_max_age_s=quote_max_age_s,
        rate_capacity=rate_capacity, rate_refill_per_s=rate_refill_per_s,
        audit_schedulers=frozenset(a.lower() for a in audit_schedulers)))
