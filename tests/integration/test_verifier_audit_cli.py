"""`verinfer audit` says why a light audit got no report (issue 38: run without
`--scheduler-key-file` it waited out its timeout, printed "missing 5" and exited 0, the reason,
`audit_not_assigned` dead-lettered after 4 deliveries, only in Redis).

Real anvil with the contracts, a committed batch on the local DA, real Redis, the real CLI
process; the verifier is an AuditWorker whose judge fails the way a verifier's does when the
KMS shards refuse the key (every shard: `audit_not_assigned`)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest
import redis

from verinfer.chain.anvil import Anvil
from verinfer.da_client.local import LocalDAClient
from verinfer.devnet.network import (
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


def refused_by_every_shard(job: AuditJob) -> Verdict:
    refusals = {i: "audit_not_assigned" for i in range(1, 6)}
    raise KeyReleaseError("epoch 1: only 0 of 5 shards issued a nonce, need 3 "
                          "(shard 1-5: audit_not_assigned)", refusals=refusals,
                          corrupt_shards=[])


def audit(node: Anvil, tmp: Path, prefix: str, start: int, timeout_s: int
          ) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "verinfer", "audit", "--sample-rate", "1", "--from-block",
         str(start), "--rpc-url", node.url, "--deployment", str(tmp / "deployment.json"),
         "--da-store", str(tmp / "da"), "--redis-url", REDIS_URL, "--prefix", prefix,
         "--timeout-s", str(timeout_s)],
        capture_output=True, text=True, timeout=timeout_s + 120,
        env={**os.environ, "COLUMNS": "200"})


def test_audit_names_why_the_verifiers_gave_up_and_exits_4(tiny_engine: Engine,
                                                           tmp_path: Path) -> None:
    r_redis = redis.Redis.from_url(REDIS_URL, decode_responses=True)
    prefixes = [f"verinfer-test-{uuid.uuid4().hex[:8]}:" for _ in range(2)]
    stop = threading.Event()
    t: threading.Thread | None = None
    try:
        with Anvil() as node:
            w3 = node.web3()
            r = roles(1)
            d = deploy_network(w3, r, tiny_engine, devnet_params(committee_size=1))
            d.save(tmp_path / "deployment.json")
            lay = provision_kms(tmp_path / "kms", tiny_engine)
            rec = register_epoch(w3, d, r, lay)
            da = LocalDAClient(tmp_path / "da")
            view = ChainView(w3, d, bind(w3, d))
            factory = EvidenceFactory(tiny_engine, ReceiptSigner(r.operator.key),
                                      Domain(d.chain_id, d.challenge_manager), key_epoch=1,
                                      epoch_public_key=epoch_public_key(rec),
                                      now=lambda: view.head()[1])
            start = w3.eth.block_number + 1
            publish_batch(da, bind(w3, d, r.operator),
                          [factory.honest(chat_body(f"audited {i}", max_tokens=3, seed=i))
                           for i in range(2)])

            worker = AuditWorker(r_redis, StreamKeys(prefixes[0]), consumer="v0",
                                 account=r.verifiers[0], judge=refused_by_every_shard,
                                 max_deliveries=2, min_idle_ms=100, block_ms=200)
            t = threading.Thread(target=worker.run, args=(stop.is_set,), daemon=True)
            t.start()
            t0 = time.monotonic()
            out = audit(node, tmp_path, prefixes[0], start, timeout_s=120)
            took = time.monotonic() - t0
            err = re.sub(r"\s+", " ", out.stderr)
            assert out.returncode == 4, (out.stdout, out.stderr[-3000:])
            assert err.count("failed receipt 0x") == 2 and "audit_not_assigned" in err, err
            assert "pass --scheduler-key-file" in err
            assert took < 100  # settled when the jobs were dead-lettered, not at the timeout

            # no verifier on the stream at all: said, and not a success either
            out = audit(node, tmp_path, prefixes[1], start, timeout_s=3)
            err = re.sub(r"\s+", " ", out.stderr)
            assert out.returncode == 4, (out.stdout, out.stderr[-3000:])
            assert "2 job(s) got no report within 3 s" in err and prefixes[1] in err
            summary = json.loads(audit_json(node, tmp_path, prefixes[1], start).stdout)
            assert summary["missing"] == 2 and summary["failed"] == []
    finally:
        stop.set()
        if t is not None:
            t.join(timeout=10)  # before its stream goes
        for p in prefixes:
            for key in r_redis.scan_iter(match=p + "*"):
                r_redis.delete(key)
        r_redis.close()


def audit_json(node: Anvil, tmp: Path, prefix: str, start: int
               ) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "verinfer", "audit", "--sample-rate", "1", "--from-block",
         str(start), "--rpc-url", node.url, "--deployment", str(tmp / "deployment.json"),
         "--da-store", str(tmp / "da"), "--redis-url", REDIS_URL, "--prefix", prefix,
         "--timeout-s", "2", "--json"], capture_output=True, text=True, timeout=120)
