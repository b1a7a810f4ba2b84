"""Light-audit worker on the real Redis (unique key prefix per test): consumer group, XACK,
retries of stale entries with XAUTOCLAIM, dead-letter stream, signed reports."""

from __future__ import annotations

import hashlib
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from eth_account import Account

from verinfer.da_client.local import LocalDAClient
from verinfer.engine.engine import Engine
from verinfer.receipts.eip712 import Domain, ReceiptSigner
from verinfer.receipts.epoch_keys import EnvelopeSuite, derive_epoch_keypair
from verinfer.testing.evidence import EvidenceFactory, chat_body
from verinfer.verifier.audit_stream import GROUP, AuditJob, AuditQueue, AuditWorker, StreamKeys
from verinfer.verifier.enclave_judge import fetch_blob
from verinfer.verifier.errors import AuditJobError
from verinfer.verifier.reexec import judge
from verinfer.verifier.reports import SignedAuditReport
from verinfer.verifier.votes import Verdict

SK, PK = derive_epoch_keypair(hashlib.sha256(b"audit epoch").digest(), EnvelopeSuite.X25519)
DOMAIN = Domain(31337, "0x5FbDB2315678afecb367f032d93F642f64180aa3")
AUDITOR = Account.from_key(hashlib.sha256(b"auditor").digest())


@pytest.fixture
def r() -> Iterator[redis.Redis]:
    client = redis.Redis(host="127.0.0.1", port=6379, decode_responses=True)
    try:
        client.ping()
    except redis.ConnectionError:
        pytest.skip("no Redis on 127.0.0.1:6379")
    yield client
    client.close()


@pytest.fixture
def keys(r: redis.Redis) -> Iterator[StreamKeys]:
    k = StreamKeys(f"vi-test-{uuid.uuid4().hex[:10]}:")
    yield k
    for key in r.scan_iter(f"{k.prefix}*"):
        r.delete(key)


@pytest.fixture(scope="module")
def factory(tiny_engine: Engine) -> EvidenceFactory:
    signer = ReceiptSigner(hashlib.sha256(b"audited operator").digest())
    return EvidenceFactory(tiny_engine, signer, DOMAIN, key_epoch=1, epoch_public_key=PK)


def _real_judge(engine: Engine, da: LocalDAClient):  # type: ignore[no-untyped-def]
    def run(job: AuditJob) -> Verdict:
        return judge(engine, job.signed.receipt, fetch_blob(da, job.ciphertext), SK)
    return run


def test_workers_audit_every_job_and_sign_reports(r: redis.Redis, keys: StreamKeys,
                                                  tiny_engine: Engine, factory: EvidenceFactory,
                                                  tmp_path: Path) -> None:
    da = LocalDAClient(tmp_path / "da")
    q = AuditQueue(r, keys)
    evs = [factory.honest(chat_body(f"question {i}", max_tokens=4, seed=i)) for i in range(3)]
    evs.append(factory.unsafe_tampered_text(chat_body("question x", max_tokens=4, seed=9)))
    ids = [q.enqueue(ev.signed, str(da.put(ev.blob))) for ev in evs]
    workers = [AuditWorker(r, keys, consumer=f"w{i}", account=AUDITOR,
                           judge=_real_judge(tiny_engine, da), block_ms=50) for i in range(2)]
    for _ in range(6):
        for w in workers:
            w.process_once()
    reports = {rep.report.job_id: rep for _, rep in q.reports()}
    assert set(reports) == set(ids)
    for job_id, ev in zip(ids, evs, strict=True):
        rep = reports[job_id]
        assert rep.verify() == AUDITOR.address
        assert rep.report.receipt_digest == ev.digest
    assert [reports[i].report.verdict.agrees for i in ids] == [True, True, True, False]
    assert reports[ids[3]].report.verdict.reason == "output_mismatch"
    assert r.xpending(keys.jobs, GROUP)["pending"] == 0
    assert sum(w.stats.done for w in workers) == 4


def test_report_signature_and_hash_are_checked(r: redis.Redis, keys: StreamKeys,
                                               factory: EvidenceFactory) -> None:
    ev = factory.honest(chat_body("sig", max_tokens=2, seed=1))
    q = AuditQueue(r, keys)
    q.enqueue(ev.signed, "da://local/0x" + "00" * 32)
    w = AuditWorker(r, keys, consumer="w", account=AUDITOR, block_ms=50,
                    judge=lambda job: Verdict(job.signed.receipt.out_hash, "match",
                                              job.signed.receipt.out_hash))
    w.process_once()
    (_, rep), = q.reports()
    d = rep.to_json()
    d["report"]["matches"] = False
    with pytest.raises(AuditJobError, match="hash"):
        SignedAuditReport.from_json(d)
    forged = SignedAuditReport(rep.report, rep.signature[:-1] + bytes([55 - rep.signature[-1]]))
    with pytest.raises(AuditJobError, match="not by its auditor"):
        forged.verify()
    with pytest.raises(AuditJobError, match="does not parse"):
        SignedAuditReport(rep.report, b"\x01" * 64 + b"\x1d").verify()


def test_failed_attempt_is_reclaimed_and_retried(r: redis.Redis, keys: StreamKeys,
                                                 factory: EvidenceFactory) -> None:
    ev = factory.honest(chat_body("retry", max_tokens=2, seed=2))
    q = AuditQueue(r, keys)
    q.enqueue(ev.signed, "da://local/0x" + "00" * 32)
    calls: list[str] = []

    def flaky(job: AuditJob) -> Verdict:
        calls.append(job.job_id)
        if len(calls) == 1:
            raise RuntimeError("KMS shard timeout")
        return Verdict(job.signed.receipt.out_hash, "match", job.signed.receipt.out_hash)

    a = AuditWorker(r, keys, consumer="a", account=AUDITOR, judge=flaky, min_idle_ms=100,
                    block_ms=50)
    b = AuditWorker(r, keys, consumer="b", account=AUDITOR, judge=flaky, min_idle_ms=100,
                    block_ms=50)
    a.process_once()  # fails, stays pending
    assert a.stats.failed_attempts == 1 and r.xpending(keys.jobs, GROUP)["pending"] == 1
    assert b.process_once() == 0  # not idle long enough yet, nothing new
    time.sleep(0.15)
    assert b.process_once() == 1  # XAUTOCLAIM takes it over
    assert b.stats.done == 1 and len(q.reports()) == 1
    assert r.xpending(keys.jobs, GROUP)["pending"] == 0


def test_poison_job_goes_to_dead_letter_after_max_deliveries(
        r: redis.Redis, keys: StreamKeys, factory: EvidenceFactory) -> None:
    ev = factory.honest(chat_body("poison", max_tokens=2, seed=3))
    q = AuditQueue(r, keys)
    q.enqueue(ev.signed, "da://local/0x" + "00" * 32)

    def broken(job: AuditJob) -> Verdict:
        raise RuntimeError("enclave crashed")

    w = AuditWorker(r, keys, consumer="w", account=AUDITOR, judge=broken, min_idle_ms=20,
                    max_deliveries=3, block_ms=20)
    for _ in range(8):
        w.process_once()
        time.sleep(0.03)
    assert w.stats.failed_attempts == 3 and w.stats.dead == 1
    (dead,) = q.dead_letters()
    assert "delivered 4 times" in dead["error"] and "enclave crashed" in dead["last_error"]
    assert r.xpending(keys.jobs, GROUP)["pending"] == 0 and q.reports() == []


def test_malformed_job_is_dead_lettered_at_once(r: redis.Redis, keys: StreamKeys) -> None:
    AuditQueue(r, keys)
    r.xadd(keys.jobs, {"job": "x", "receipt": "{not json", "ciphertext": "da://local/0x00"})
    w = AuditWorker(r, keys, consumer="w", account=AUDITOR, block_ms=20,
                    judge=lambda job: pytest.fail("must not run"))
    w.process_once()
    (dead,) = AuditQueue(r, keys).dead_letters()
    assert "malformed audit job" in dead["error"]
