"""Five real shard processes on loopback (t = 3): threshold behaviour with shards going down
and coming back, retirement reaching running shards, and the `verinfer enclave run` CLI."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from eth_account import Account
from eth_account.signers.local import LocalAccount

from verinfer.attestation.quotes import measurement
from verinfer.attestation.software import SoftwareAttester, load_root_private
from verinfer.enclave.errors import KeyReleaseError
from verinfer.enclave.runner import AccountSigner, EnclaveRunner
from verinfer.kms.epochs import FileEpochRegistry
from verinfer.kms.local_cluster import ClusterLayout, ShardProcesses, add_epoch, provision
from verinfer.kms.release_log import verify_release_log
from verinfer.receipts.epoch_keys import load_public_key

ARGS = ("sha256:" + "33" * 32, "code-v1", "engine-fp")
M = measurement(*ARGS)


@dataclass
class Cluster:
    lay: ClusterLayout
    procs: ShardProcesses
    member: LocalAccount
    runner: EnclaveRunner


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    member = Account.create()
    lay = provision(tmp_path_factory.mktemp("kms-cluster"), epoch=1, threshold=3, shares=5,
                    measurements=[M], verifiers=[member.address],
                    challenges={"c1": [member.address]}, unsafe_single_tree=True)
    with ShardProcesses(lay, extra_args=["--rate-capacity", "100"]) as procs:
        procs.start()
        runner = EnclaveRunner(
            attester=SoftwareAttester(load_root_private(lay.root_key), M, time.time),
            shards=lay.shards_info(), epochs=FileEpochRegistry(lay.registry),
            signer=AccountSigner(member))
        yield Cluster(lay, procs, member, runner)


def _key_matches(c: Cluster, epoch: int = 1) -> list[int]:
    rec = FileEpochRegistry(c.lay.registry).get(epoch)
    with c.runner.obtain_key(epoch=epoch, purpose="full_challenge", challenge_id="c1") as key:
        assert key.private_key is not None
        assert key.private_key.public_key().to_bytes() == rec.public_key_bytes
        return key.shards_used


def test_one_or_two_shards_down_still_leave_t(cluster: Cluster) -> None:
    assert _key_matches(cluster) == [1, 2, 3]
    cluster.procs.stop(2)
    assert _key_matches(cluster) == [1, 3, 4]
    cluster.procs.stop(4)
    assert _key_matches(cluster) == [1, 3, 5]
    cluster.procs.stop(5)
    with pytest.raises(KeyReleaseError, match="only 2 of 5"):
        _key_matches(cluster)
    cluster.procs.start([2, 4, 5])  # restarted shards continue their release-log chain
    assert _key_matches(cluster) == [1, 2, 3]
    for i in range(1, 6):
        n, _ = verify_release_log(cluster.lay.release_log(i))
        assert n >= 1


def test_health_and_metrics_over_http(cluster: Cluster) -> None:
    info = cluster.lay.shards_info()[0]
    assert httpx.get(info.url + "/health").json()["address"] == info.address
    text = httpx.get(info.url + "/metrics").text
    assert "kms_release_decisions_total" in text and "kms_release_seconds_bucket" in text


def test_rotation_and_retirement_reach_running_shards(cluster: Cluster) -> None:
    add_epoch(cluster.lay, epoch=2, threshold=3)
    assert _key_matches(cluster, epoch=2)
    r = subprocess.run([sys.executable, "-m", "verinfer", "kms", "retire", "--epoch", "2",
                        "--registry", str(cluster.lay.registry)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    with pytest.raises(KeyReleaseError) as ei:
        _key_matches(cluster, epoch=2)
    assert set(ei.value.refusals.values()) == {"epoch_retired"}
    assert _key_matches(cluster, epoch=1)  # epoch 1 stays live


def test_enclave_run_cli(cluster: Cluster, tmp_path: Path) -> None:
    rec = FileEpochRegistry(cluster.lay.registry).get(1)
    pk = load_public_key(rec.suite, rec.public_key_bytes)
    blob = pk.suite.hpke.encrypt(b"hello from the cli", pk.hpke, info=b"")
    keyfile = tmp_path / "requester.key"
    keyfile.write_text(cluster.member.key.hex())
    r = subprocess.run(
        [sys.executable, "-m", "verinfer", "enclave", "run",
         "--root-key", str(cluster.lay.root_key), "--container-digest", ARGS[0],
         "--code-hash", ARGS[1], "--engine-fingerprint", ARGS[2],
         "--directory", str(cluster.lay.directory), "--registry", str(cluster.lay.registry),
         "--epoch", "1", "--challenge-id", "c1", "--requester-key", str(keyfile),
         "--job", "verinfer.enclave.jobs:open_blob",
         "--job-args", json.dumps({"blob": "0x" + blob.hex()})],
        capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert bytes.fromhex(out["result"][2:]) == b"hello from the cli"
    assert len(out["shards_used"]) == 3 and out["corrupt_shards"] == []
