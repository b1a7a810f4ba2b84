"""Issue 24.4: the shards' signed release-log heads are published (bundle on DA, hash and
pointer in a transaction on chain), and a shard holder's log is checked against every
published head — so truncating or editing the log *and* its heads file together, which the
host's own files cannot catch, fails once a head has been published.

Real processes: anvil, two KMS shard processes, the local DA store, `verinfer kms verify-log`."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import rfc8785
from eth_account import Account
from web3 import Web3

from adversarial.kms_adversary import make_cluster, signed_request
from verinfer.chain.anvil import Anvil, dev_accounts
from verinfer.da_client.local import LocalDAClient
from verinfer.da_client.pointer import Pointer
from verinfer.kms.local_cluster import ClusterLayout, ShardProcesses
from verinfer.kms.log_publish import (
    TAG,
    LogHeadPublisher,
    LogPublicationError,
    calldata,
    read_publication,
)
from verinfer.kms.release_log import heads_path, read_heads, verify_release_log


@dataclass
class World:
    w3: Web3
    rpc: str
    lay: ClusterLayout
    procs: ShardProcesses
    da: LocalDAClient
    da_dir: Path
    publisher: LogHeadPublisher
    index: Path


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    tmp = tmp_path_factory.mktemp("log-publish")
    lay, _ = make_cluster(tmp / "kms", n=2, t=2)
    # heads answered fresh (the shard's default signs one at most every 10 s)
    with Anvil() as node, ShardProcesses(lay, extra_args=["--head-interval", "0"]) as procs:
        procs.start()
        w3 = node.web3()
        da = LocalDAClient(tmp / "da")
        index = tmp / "log-heads.jsonl"
        pub = LogHeadPublisher(lay.shards_info(), da, w3, dev_accounts(1)[0], index_path=index)
        yield World(w3, node.url, lay, procs, da, tmp / "da", pub, index)


def _refusals(world: World, shard: int, n: int) -> None:
    url = {s.index: s.url for s in world.lay.shards_info()}[shard]
    for _ in range(n):  # refusals of authenticated requests are logged decisions
        body = signed_request(world.lay, url, shard, Account.create()).to_json()
        assert httpx.post(url + "/v1/release", json=body, timeout=5).status_code == 403


def _verify_cli(world: World, shard: int, *published: str) -> tuple[int, dict]:
    addr = {s.index: s.address for s in world.lay.shards_info()}[shard]
    pub_args = [a for p in published for a in ("--published", p)]
    r = subprocess.run([sys.executable, "-m", "verinfer", "kms", "verify-log",
                        str(world.lay.release_log(shard)), "--address", addr, *pub_args,
                        "--rpc-url", world.rpc, "--da-store", str(world.da_dir)],
                       capture_output=True, text=True, timeout=60)
    return r.returncode, json.loads(r.stdout.strip().splitlines()[-1])


def _lines(p: Path) -> list[dict]:
    return [json.loads(x) for x in p.read_text().splitlines()]


def test_published_heads_catch_a_log_cut_together_with_its_heads_file(world: World) -> None:
    _refusals(world, 1, 3)
    first = world.publisher.publish_once()
    assert sorted(h.shard_index for h in first.heads) == [1, 2] and not first.failed
    assert {h.shard_index: h.count for h in first.heads}[1] == 3
    # the chain and DA give back exactly the heads published (signatures checked)
    again = read_publication(world.w3, world.da, first.tx_hash, Pointer.parse)
    assert [h.to_json() for h in again.heads] == [h.to_json() for h in first.heads]

    _refusals(world, 1, 2)
    world.procs.stop(2)  # a shard that does not answer is named, the others still published
    second = world.publisher.publish_once()
    assert [h.shard_index for h in second.heads] == [1] and set(second.failed) == {2}
    assert second.heads[0].count == 5
    world.procs.stop(1)

    path = world.lay.release_log(1)
    entries = _lines(path)
    assert len(entries) == 5
    # the holder drops the last entry and every head that covers it, locally: their files agree
    path.write_text("".join(rfc8785.dumps(e).decode() + "\n" for e in entries[:4]))
    hp = heads_path(path)
    kept = [h for h in read_heads(hp) if h.count <= 4]
    hp.write_text("".join(rfc8785.dumps(h.to_json()).decode() + "\n" for h in kept))
    assert verify_release_log(path, heads=read_heads(hp))[0] == 4  # the host is fooled...
    rc, out = _verify_cli(world, 1, str(world.index))  # ...the published heads are not
    assert rc == 2 and out["reason"] == "truncated_below_signed_head", out
    # the first publication alone (count 3) is still extended by the cut log
    rc, out = _verify_cli(world, 1, first.tx_hash)
    assert rc == 0 and out["signed_heads_checked"] >= 1, out


def test_forged_publications_are_refused(world: World) -> None:
    acct = dev_accounts(2)[1]

    def send(data: bytes) -> str:
        tx: dict[str, Any] = {"to": acct.address, "value": 0, "data": data, "gas": 100_000,
              "chainId": world.w3.eth.chain_id, "maxFeePerGas": 10**10,
              "maxPriorityFeePerGas": 10**9,
              "nonce": world.w3.eth.get_transaction_count(acct.address, "pending")}
        h = world.w3.eth.send_raw_transaction(acct.sign_transaction(tx).raw_transaction)
        world.w3.eth.wait_for_transaction_receipt(h)
        return "0x" + bytes(h).hex()

    real = json.loads(world.index.read_text().splitlines()[0])
    other = world.da.put(b"not the bundle")
    cases = {
        "not_a_publication": send(b"hello"),
        # a publication whose hash does not match what DA holds at its pointer
        "bundle_hash_mismatch": send(calldata(hashlib.sha256(b"x").digest(), real["pointer"])),
        # hash and pointer agree, but the blob is not a bundle of signed heads
        "bundle_malformed": send(calldata(hashlib.sha256(b"not the bundle").digest(),
                                          str(other))),
        "bundle_unavailable": send(TAG + b"\x00" * 32 + b"local:" + b"ab" * 32),
    }
    for reason, tx in cases.items():
        with pytest.raises(LogPublicationError) as ei:
            read_publication(world.w3, world.da, tx, Pointer.parse)
        assert ei.value.reason == reason, (reason, ei.value.message)
    rc, out = _verify_cli(world, 1, cases["bundle_hash_mismatch"])
    assert rc == 2 and out["reason"] == "bundle_hash_mismatch"
