"""Issue 32.5 on real shard processes: refused requests do not fill a shard's disk.

Before: every refused request was appended and fsync'd to the release log (~1.7 KB of log and
heads per request with the head poll) and each ``GET /v1/log/head`` after one signed and
fsync'd a new head: ~19 GB a day from one client, and a restart replays the whole log. Now a
refusal before authentication (checks 1-6) is counted in the metrics only, a head is signed
for ``/v1/log/head`` at most every ``--head-interval`` seconds, and each source address has a
token bucket on the POST endpoints. A refusal *after* authentication (a genuine enclave's quote,
a valid requester signature) is still logged."""

from __future__ import annotations

import re
from pathlib import Path

import httpx
from eth_account import Account

from adversarial.kms_adversary import make_cluster, signed_request
from verinfer.kms.local_cluster import ShardProcesses
from verinfer.kms.release_log import heads_path, read_heads, verify_release_log

REFUSALS = 40


def _size(p: Path) -> int:
    return p.stat().st_size if p.exists() else 0


def _metric(text: str, reason: str) -> float:
    m = re.search(r'kms_release_decisions_total\{decision="refused",reason="' + reason
                  + r'"\} ([0-9.e+]+)', text)
    return float(m.group(1)) if m else 0.0


def test_unauthenticated_refusals_cost_no_log_and_heads_are_rate_limited(
        tmp_path: Path) -> None:
    lay, _ = make_cluster(tmp_path / "kms", n=2, t=2)
    with ShardProcesses(lay, extra_args=["--head-interval", "60"]) as procs:
        procs.start([1])
        url = lay.shards_info()[0].url
        log, heads = lay.release_log(1), heads_path(lay.release_log(1))
        before = _size(log) + _size(heads)
        forged = signed_request(lay, url, 1, Account.create()).to_json()
        forged["nonces"] = {"1": "0x" + "00" * 32}  # not a nonce of this shard
        with httpx.Client(timeout=10) as c:
            for i in range(REFUSALS):
                r = c.post(url + "/v1/release",
                           **({"json": {}} if i % 2 else {"json": forged}))
                assert r.status_code in (400, 403), r.text
                assert c.get(url + "/v1/log/head").status_code == 200
            text = c.get(url + "/metrics").text
        written = _size(log) + _size(heads) - before
        print(f"{REFUSALS} unauthenticated refusals with a head poll after each: {written} "
              f"bytes written to the release log and its heads")
        assert written == 0
        assert _metric(text, "bad_request") == REFUSALS // 2
        assert _metric(text, "nonce_unknown") == REFUSALS // 2

        # an authenticated refusal is logged; the head poll right after it gets the cached
        # head (signed at start, under 60 s ago), not a new signature
        outsider = signed_request(lay, url, 1, Account.create()).to_json()
        r = httpx.post(url + "/v1/release", json=outsider, timeout=10)
        assert r.status_code == 403 and r.json()["error"]["reason"] == "not_committee_member"
        assert verify_release_log(log)[0] == 1
        n_heads = len(read_heads(heads))
        for _ in range(5):
            assert httpx.get(url + "/v1/log/head", timeout=5).json()["count"] == 0
        assert len(read_heads(heads)) == n_heads


def test_source_rate_limit_refuses_before_reading(tmp_path: Path) -> None:
    lay, _ = make_cluster(tmp_path / "kms", n=2, t=2)
    with ShardProcesses(lay, extra_args=["--source-rate-capacity", "5",
                                         "--source-rate-refill", "0.01"]) as procs:
        procs.start([1])
        url = lay.shards_info()[0].url
        with httpx.Client(timeout=10) as c:
            codes = [c.post(url + "/v1/release", json={}).status_code for _ in range(8)]
            assert codes == [400] * 5 + [429] * 3, codes
            assert c.post(url + "/v1/decrypt", json={}).status_code == 429
            # nonces, heads and health are not behind the bucket
            assert c.post(url + "/v1/nonce").status_code == 200
            assert c.get(url + "/v1/log/head").status_code == 200
            text = c.get(url + "/metrics").text
        assert 'kms_gate_refusals_total{reason="rate_limited"} 4.0' in text
        assert _size(lay.release_log(1)) == 0
