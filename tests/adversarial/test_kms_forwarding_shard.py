"""Issue 24.3 on real processes: one faulty shard cannot block a release.

The enclave sends every shard the same body (its quote binds all nonces). Shard 1 here is
malicious: it forwards the body it receives to shards 2-5 before refusing, so that they spend
their nonces on its copy and answer the enclave's own copy with ``nonce_replayed`` (before the
fix: 0 shares). Or it forwards an altered copy, hoping a refused attempt burns their nonces.
A t-of-n KMS must tolerate n - t such shards: the requester still gets its key from the
honest ones."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from eth_account.signers.local import LocalAccount

from adversarial.kms_adversary import EvilShard, make_cluster, runner
from verinfer.kms.epochs import FileEpochRegistry
from verinfer.kms.local_cluster import ClusterLayout, ShardProcesses
from verinfer.kms.release_log import verify_release_log


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory
            ) -> Iterator[tuple[ClusterLayout, LocalAccount]]:
    lay, member = make_cluster(tmp_path_factory.mktemp("kms-fwd"), n=5, t=3)
    with ShardProcesses(lay, extra_args=["--rate-capacity", "100"]) as procs:
        procs.start([2, 3, 4, 5])
        yield lay, member


def _records(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def _log(lay: ClusterLayout, i: int) -> list[dict]:
    return [json.loads(x) for x in lay.release_log(i).read_text().splitlines()]


def test_forwarded_body_does_not_block_the_release(cluster) -> None:
    lay, member = cluster
    record = lay.root / "forward.jsonl"
    evil = EvilShard(lay, 1, "forward", record)
    try:
        rec = FileEpochRegistry(lay.registry).get(1)
        with runner(lay, member).obtain_key(epoch=1, purpose="full_challenge",
                                            challenge_id="c1") as key:
            assert key.private_key is not None
            assert key.private_key.public_key().to_bytes() == rec.public_key_bytes
            assert key.shards_used == [2, 3, 4]
            assert key.refusals == {1: "not_committee_member"}
    finally:
        evil.stop()
    # the attack really ran: shard 1 got the body and the honest shards answered its copy
    (attempt,) = _records(record)
    assert {a[0] for a in attempt["answers"].values()} == {200}
    # each honest shard asked by the enclave released once and repeated the identical answer
    # once (to whichever copy came second); shard 5 only ever saw the forwarded copy
    for i in (2, 3, 4):
        reasons = [e["reason"] for e in _log(lay, i) if e["decision"] == "released"]
        assert reasons == ["released", "repeat_of_identical_request"], (i, reasons)
        verify_release_log(lay.release_log(i))


def test_altered_copies_do_not_burn_nonces(cluster) -> None:
    lay, member = cluster
    record = lay.root / "tamper.jsonl"
    evil = EvilShard(lay, 1, "tamper", record)
    try:
        with runner(lay, member).obtain_key(epoch=1, purpose="full_challenge",
                                            challenge_id="c1") as key:
            assert key.private_key is not None
            assert key.shards_used == [2, 3, 4]
    finally:
        evil.stop()
    (attempt,) = _records(record)
    assert {tuple(a) for a in attempt["answers"].values()} == {(403, "report_data_mismatch")}
