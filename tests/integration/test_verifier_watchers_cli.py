"""The watchers' commands as a person reads them (issue 38).

`verinfer audit` says why a light audit got no report (before: run without
`--scheduler-key-file` it waited out its timeout, printed "missing 5" and exited 0, the reason,
`audit_not_assigned` dead-lettered after 4 deliveries, only in Redis). `verinfer challenge`
prints no source location, whole hashes and deadlines as dates (before: `challenge_cli.py:102`
beside each line, hashes cut with an ellipsis, deadlines in unix seconds).

Real anvil with the contracts, a committed batch on the local DA, real Redis, the real CLI
processes; the audit's verifier is an AuditWorker whose judge fails the way a verifier's does
when the KMS shards refuse the key (every shard: `audit_not_assigned`)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis

from verinfer.chain.anvil import Anvil
from verinfer.da_client.local import LocalDAClient
from verinfer.devnet.network import (
    Roles,
    bind,
    deploy_network,
    devnet_params,
    epoch_public_key,
    provision_kms,
    publish_batch,
    register_epoch,
    roles,
)
from verinfer.enclave.errors import KeyReleaseError
from verinfer.engine.engine import Engine
from verinfer.receipts.eip712 import Domain, ReceiptSigner
from verinfer.testing.evidence import EvidenceFactory, chat_body
from verinfer.verifier.audit_stream import AuditJob, AuditWorker, StreamKeys
from verinfer.verifier.chain_view import ChainView
from verinfer.verifier.votes import Verdict

pytestmark = [pytest.mark.process, pytest.mark.loopback, pytest.mark.anvil, pytest.mark.redis]

REDIS_URL = "redis://127.0.0.1:6379/0"
VI = [sys.executable, "-m", "verinfer"]


@dataclass
class Net:
    node: Anvil
    dir: Path
    roles: Roles
    start: int  # the first block of the committed batch
    withheld: Path  # a signed receipt the operator never published (a claim's subject)

    def chain_args(self) -> list[str]:
        return ["--rpc-url", self.node.url, "--deployment", str(self.dir / "deployment.json"),
                "--da-store", str(self.dir / "da")]


@pytest.fixture(scope="module")
def net(tiny_engine: Engine, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Net]:
    tmp = tmp_path_factory.mktemp("watchers")
    with Anvil() as node:
        w3 = node.web3()
        r = roles(1)
        d = deploy_network(w3, r, tiny_engine, devnet_params(committee_size=1))
        d.save(tmp / "deployment.json")
        lay = provision_kms(tmp / "kms", tiny_engine)
        rec = register_epoch(w3, d, r, lay)
        da = LocalDAClient(tmp / "da")
        view = ChainView(w3, d, bind(w3, d))
        factory = EvidenceFactory(tiny_engine, ReceiptSigner(r.operator.key),
                                  Domain(d.chain_id, d.challenge_manager), key_epoch=1,
                                  epoch_public_key=epoch_public_key(rec),
                                  now=lambda: view.head()[1])
        start = w3.eth.block_number + 1
        evs = [factory.honest(chat_body(f"audited {i}", max_tokens=3, seed=i)) for i in range(2)]
        withheld = factory.honest(chat_body("never published", max_tokens=3, seed=9))
        publish_batch(da, bind(w3, d, r.operator), [*evs, withheld], withheld=[withheld])
        (tmp / "withheld.json").write_text(json.dumps(withheld.signed.to_json()))
        yield Net(node, tmp, r, start, tmp / "withheld.json")


def refused_by_every_shard(job: AuditJob) -> Verdict:
    refusals = {i: "audit_not_assigned" for i in range(1, 6)}
    raise KeyReleaseError("epoch 1: only 0 of 5 shards issued a nonce, need 3 "
                          "(shard 1-5: audit_not_assigned)", refusals=refusals,
                          corrupt_shards=[])


def audit(net: Net, prefix: str, timeout_s: int, *more: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*VI, "audit", "--sample-rate", "1", "--from-block", str(net.start), *net.chain_args(),
         "--redis-url", REDIS_URL, "--prefix", prefix, "--timeout-s", str(timeout_s), *more],
        capture_output=True, text=True, timeout=timeout_s + 120,
        env={**os.environ, "COLUMNS": "200"})


def test_audit_names_why_the_verifiers_gave_up_and_exits_4(net: Net) -> None:
    r_redis = redis.Redis.from_url(REDIS_URL, decode_responses=True)
    prefixes = [f"verinfer-test-{uuid.uuid4().hex[:8]}:" for _ in range(2)]
    stop = threading.Event()
    t: threading.Thread | None = None
    try:
        worker = AuditWorker(r_redis, StreamKeys(prefixes[0]), consumer="v0",
                             account=net.roles.verifiers[0], judge=refused_by_every_shard,
                             max_deliveries=2, min_idle_ms=100, block_ms=200)
        t = threading.Thread(target=worker.run, args=(stop.is_set,), daemon=True)
        t.start()
        t0 = time.monotonic()
        out = audit(net, prefixes[0], 120)
        took = time.monotonic() - t0
        err = re.sub(r"\s+", " ", out.stderr)
        assert out.returncode == 4, (out.stdout, out.stderr[-3000:])
        assert err.count("failed receipt 0x") == 2 and "audit_not_assigned" in err, err
        assert "pass --scheduler-key-file" in err
        assert took < 100  # settled when the jobs were dead-lettered, not at the timeout

        # no verifier on the stream at all: said, and not a success either
        out = audit(net, prefixes[1], 3)
        err = re.sub(r"\s+", " ", out.stderr)
        assert out.returncode == 4, (out.stdout, out.stderr[-3000:])
        assert "2 job(s) got no report within 3 s" in err and prefixes[1] in err
        summary = json.loads(audit(net, prefixes[1], 2, "--json").stdout)
        assert summary["missing"] == 2 and summary["failed"] == []
    finally:
        stop.set()
        if t is not None:
            t.join(timeout=10)  # before its stream goes
        for p in prefixes:
            for key in r_redis.scan_iter(match=p + "*"):
                r_redis.delete(key)
        r_redis.close()


def test_challenge_output_is_whole_and_dated(net: Net) -> None:
    """`verinfer devnet challenge` (= `verinfer challenge` with anvil's clock moved) on a
    receipt the operator never published: a claim, its status table printed."""
    out = subprocess.run(
        [*VI, "devnet", "challenge", str(net.withheld), *net.chain_args(), "--no-wait"],
        capture_output=True, text=True, timeout=180,
        env={**os.environ, "COLUMNS": "80",
             "VERINFER_CHAIN_PRIVATE_KEY": net.roles.challenger.key.hex()})
    assert out.returncode == 0, (out.stdout, out.stderr[-3000:])
    text = out.stderr
    assert ".py:" not in text, text  # no source location beside a line
    assert "…" not in text, text  # nothing cut
    squashed = re.sub(r"[\s│]", "", text)
    assert re.search(r"openedclaim\d+forreceipt0x[0-9a-f]{64}", squashed), text
    assert re.search(r"receiptDigest0x[0-9a-f]{64}", squashed), text
    assert re.search(r"responseDeadline\d{4}-\d\d-\d\d\d\d:\d\d:\d\dUTC\(\d+\)", squashed), text
