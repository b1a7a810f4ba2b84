"""Issue 24.4: the release log cannot be truncated or edited undetected.

An unkeyed hash chain proves nothing: whoever holds the file drops the tail, or edits a middle
entry and re-hashes everything after it, and the chain still verifies. Heads signed with the
shard's identity key (checkpoint file, GET /v1/log/head) commit the shard to what it logged."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import rfc8785
from eth_account import Account

from adversarial.kms_adversary import make_cluster, signed_request
from verinfer.kms.errors import ShardUnavailableError
from verinfer.kms.local_cluster import ShardProcesses
from verinfer.kms.release_log import (
    ReleaseLog,
    ReleaseLogError,
    SignedHead,
    heads_path,
    read_heads,
    verify_release_log,
)


def _lines(p: Path) -> list[dict]:
    return [json.loads(x) for x in p.read_text().splitlines()]


def _write(p: Path, entries: list[dict]) -> None:
    p.write_text("".join(rfc8785.dumps(e).decode() + "\n" for e in entries))


def _rechain(entries: list[dict]) -> list[dict]:
    """What a forger does after editing: recompute prev/hash of every entry."""
    prev = "0" * 64
    out = []
    for e in entries:
        e = {**e, "prev": prev}
        e.pop("hash", None)
        e["hash"] = hashlib.sha256(rfc8785.dumps(e)).hexdigest()
        prev = e["hash"]
        out.append(e)
    return out


@pytest.fixture
def log(tmp_path: Path) -> tuple[ReleaseLog, Path]:
    acct = Account.create()
    rl = ReleaseLog(tmp_path / "release-log.jsonl", signer=acct, shard_index=1,
                    checkpoint_every=4)
    for i in range(10):
        rl.append({"decision": "released", "reason": "released", "requester": f"r{i}"})
    rl.checkpoint()  # as at shutdown
    return rl, tmp_path / "release-log.jsonl"


def _verify(path: Path) -> tuple[int, str]:
    return verify_release_log(path, heads=read_heads(heads_path(path)))


def test_intact_log_verifies_against_its_heads(log) -> None:
    _, path = log
    heads = read_heads(heads_path(path))
    assert [h.count for h in heads] == [0, 4, 8, 10]  # start, every 4, shutdown
    assert _verify(path)[0] == 10


def test_edited_middle_entry_fails(log) -> None:
    _, path = log
    entries = _lines(path)
    entries[5]["requester"] = "someone-else"
    _write(path, entries)
    with pytest.raises(ReleaseLogError) as ei:
        _verify(path)
    assert ei.value.reason == "entry_hash_mismatch"
    # re-hashing the chain after the edit no longer helps: the signed heads disagree
    _write(path, _rechain(entries))
    assert verify_release_log(path)[0] == 10  # the bare chain is fooled ...
    with pytest.raises(ReleaseLogError) as ei:
        _verify(path)
    assert ei.value.reason == "diverges_from_signed_head"  # ... the signed heads are not


def test_dropped_tail_below_signed_head_fails(log) -> None:
    rl, path = log
    published = SignedHead.from_json(json.loads(json.dumps(rl.latest_head().to_json())))
    _write(path, _lines(path)[:7])
    assert verify_release_log(path)[0] == 7  # a valid bare chain
    with pytest.raises(ReleaseLogError) as ei:
        _verify(path)
    assert ei.value.reason == "truncated_below_signed_head"
    # a head that left the host (e.g. from GET /v1/log/head) catches it even when the heads
    # file is cut as well
    heads_path(path).write_text("")
    assert _verify(path)[0] == 7
    with pytest.raises(ReleaseLogError) as ei:
        verify_release_log(path, heads=[published])
    assert ei.value.reason == "truncated_below_signed_head"


def test_forged_head_signature_fails(log) -> None:
    _, path = log
    forged = SignedHead.sign(Account.create(), shard_index=1, count=10, head="0" * 64,
                             time_s=0)
    with pytest.raises(ReleaseLogError) as ei:
        verify_release_log(path, heads=[*read_heads(heads_path(path)), forged])
    assert ei.value.reason == "head_wrong_shard"
    d = forged.to_json()
    d["count"] = 3  # a head altered after signing
    with pytest.raises(ReleaseLogError) as ei:
        SignedHead.from_json(d).check_signature()
    assert ei.value.reason == "head_signature_invalid"


def test_restarted_shard_refuses_an_edited_log_and_verify_log_names_it(
        tmp_path: Path) -> None:
    lay, _ = make_cluster(tmp_path / "kms", n=2, t=2)
    with ShardProcesses(lay, extra_args=["--checkpoint-every", "2",
                                         "--head-interval", "0"]) as procs:
        procs.start([1])
        url = lay.shards_info()[0].url
        for _ in range(5):  # refusals of authenticated requests are logged decisions too
            body = signed_request(lay, url, 1, Account.create()).to_json()
            assert httpx.post(url + "/v1/release", json=body, timeout=5).status_code == 403
        head = httpx.get(url + "/v1/log/head", timeout=5).json()
        assert head["count"] == 5 and head["address"] == lay.shards_info()[0].address
        SignedHead.from_json(head).check_signature(lay.shards_info()[0].address)
        procs.stop(1)  # shutdown signs a last head
        path = lay.release_log(1)
        assert read_heads(heads_path(path))[-1].count == 5
        entries = _lines(path)
        entries[1]["reason"] = "released"
        _write(path, _rechain(entries))
        t0 = time.monotonic()
        with pytest.raises(ShardUnavailableError, match="exited with 2"):
            procs.start([1])
        assert time.monotonic() - t0 < 30
        assert "diverges_from_signed_head" in lay.server_log(1).read_text()
    r = subprocess.run([sys.executable, "-m", "verinfer", "kms", "verify-log", str(path),
                        "--address", lay.shards_info()[0].address],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2
    assert json.loads(r.stdout)["reason"] == "diverges_from_signed_head"
