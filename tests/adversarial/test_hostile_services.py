"""Issue 32: every HTTP service holds its budget against hostile clients (docs/budgets.md).

Real processes on loopback — the operator (`verinfer serve`, tiny model, receipts on), one KMS
shard, the explorer (its chain RPC, KMS shard and operator are hostile peers: a drip, a 1 GiB
answer, silence) and the fake EigenDA proxy — each attacked from 127.0.0.2 with slow bodies,
slowloris headers, oversized and mis-encoded bodies, value-count and depth bombs, floods of
cheap refused requests and many idle connections (``verinfer.testing.hostile``; the reduced
scale ``FAST``: 1.2 s per attack). While each attack runs, an honest client on 127.0.0.1
probes /health and sends real requests. Each case asserts the summary table's budget: RSS
growth <= 256 MB, /health p99 <= 250 ms, data directory growth <= 64 MB, every honest request
answered, an honest answer after the attack, and no 5xx but 503 to the attacker. The /health
budget counts on top of the p99 the same probe saw just before the attack, and a case that
misses on latency alone (every probe answered) is measured up to twice more: the CI machine
is shared. The full scale is ``bench/hostile.py``.

A case whose finding is not fixed yet is ``xfail(strict=True)`` with the finding: it starts
failing the suite (XPASS) the moment the fix lands, and is then flipped to a plain case.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from verinfer.testing.hostile import (
    BUDGET,
    FAST,
    Service,
    Stalled,
    explorer_service,
    fake_eigenda_service,
    kms_shard_service,
    operator_service,
    run_case,
    stalled_connections,
)
from verinfer.testing.hostile import (
    request as http_request,
)

#: per service: connections opened when it started that stall before their headers are in
STALLED: dict[str, Stalled] = {}


@pytest.fixture(scope="module")
def operator(tiny_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    with operator_service(tiny_path, tmp_path_factory.mktemp("hostile-operator")) as svc, \
            stalled_connections(svc) as held:
        STALLED[svc.name] = held
        yield svc


@pytest.fixture(scope="module")
def kms_shard(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    with kms_shard_service(tmp_path_factory.mktemp("hostile-kms")) as svc, \
            stalled_connections(svc) as held:
        STALLED[svc.name] = held
        yield svc


@pytest.fixture(scope="module")
def explorer(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    with explorer_service(tmp_path_factory.mktemp("hostile-explorer")) as svc, \
            stalled_connections(svc) as held:
        STALLED[svc.name] = held
        yield svc


@pytest.fixture(scope="module")
def fake_eigenda(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    with fake_eigenda_service(tmp_path_factory.mktemp("hostile-eigenda")) as svc, \
            stalled_connections(svc) as held:
        STALLED[svc.name] = held
        yield svc


BODY_ATTACKS = ("slow_body", "slowloris", "oversized", "misencoded", "bombs", "flood", "idle")
CASES = {
    "operator": BODY_ATTACKS,
    "kms_shard": BODY_ATTACKS,
    "explorer": ("slow_body", "slowloris", "oversized", "flood", "idle", "hostile_peers"),
    "fake_eigenda": ("slow_body", "slowloris", "oversized", "flood", "idle"),
}

#: Findings not fixed yet: (service, attack) -> the finding. Strict: a fix turns it XPASS.
#: Empty since a2805e5 (per-address caps: connections, bodies in progress) — it held the
#: operator's slow bodies (honest 1/56 served, 503 server_busy) and the operator's and the
#: shard's idle connections (every probe 503) — and dddc674 (the chain RPC's whole-call
#: deadline, the explorer's follower case below).
OPEN_FINDINGS: dict[tuple[str, str], str] = {}


#: times a case that misses on /health latency alone is measured again
MEASURE_AGAIN = 2


def _params() -> list[object]:
    out: list[object] = []
    for service, attacks in CASES.items():
        for attack in attacks:
            finding = OPEN_FINDINGS.get((service, attack))
            marks = [pytest.mark.xfail(strict=True, reason=finding)] if finding else []
            out.append(pytest.param(service, attack, marks=marks, id=f"{service}-{attack}"))
    return out


@pytest.mark.parametrize(("service", "attack"), _params())
def test_service_holds_its_budget_under_attack(request: pytest.FixtureRequest, service: str,
                                               attack: str) -> None:
    svc: Service = request.getfixturevalue(service)
    result = run_case(svc, attack, FAST)
    print(result.row())
    for _ in range(MEASURE_AGAIN):
        missed = result.over_budget(beside_noise=True)
        if not missed or result.health_failed or not all(m.startswith("health p99")
                                                         for m in missed):
            break
        # latency alone, every probe answered: on the shared 2-core CI machine one scheduler
        # stall is the whole p99 of ~20 probes (seen: 844 ms, then 428 ms, for a case whose
        # service used 0.1 core), so a latency miss is measured again
        result = run_case(svc, attack, FAST)
        print("again:", result.row())
    assert svc.pid and result.health_n > 0 and result.honest_n > 0
    assert not result.over_budget(beside_noise=True), (result.over_budget(beside_noise=True),
                                                        result.row())


def test_open_findings_name_real_cases() -> None:
    """An entry of OPEN_FINDINGS that names no case would hide nothing and prove nothing."""
    for service, attack in OPEN_FINDINGS:
        assert attack in CASES[service], (service, attack)


def test_explorer_says_when_its_chain_rpc_drips(explorer: Service) -> None:
    """The explorer's RPC peer has dripped since it started (``explorer_service``). 15 s
    after the start, a call with a whole-answer deadline of 10 s has failed and the status
    the pages show names the error. Before dddc674 (web3's timeout was per read) the follower
    waited for ever and the footer said nothing was wrong (xfail until then)."""
    time.sleep(max(0.0, explorer.started_at + 15 - time.monotonic()))
    status, body = http_request(explorer.host, explorer.port, "GET", "/api/status")
    assert status == 200
    state = json.loads(body)
    assert state["follower_error"], state


@pytest.mark.parametrize("service", [
    "operator", "kms_shard",
    "explorer",  # xfail until a2805e5: bare uvicorn.run, no header deadline (held for ever)
    "fake_eigenda",  # xfail until its idle timeout (10 s): a thread per connection, held for ever
])
def test_connections_stalled_before_their_headers_are_closed(request: pytest.FixtureRequest,
                                                             service: str) -> None:
    """A connection opened when the service started, with part of a request line and then
    nothing, and one with nothing at all: both closed by the service within the budget's
    12 s (the header deadline is 10 s). Run after the attack cases, so usually no wait."""
    request.getfixturevalue(service)
    held = STALLED[service]
    time.sleep(max(0.0, held.opened_at + BUDGET.stall_s - time.monotonic()))
    assert held.closed_by_service() == [True, True]
