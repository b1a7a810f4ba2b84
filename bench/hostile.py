"""Hostile clients against every verinfer HTTP service: what each attack costs (issue 32).

Real processes on loopback: the operator (`verinfer serve`, the tests' tiny model, receipts on),
one KMS shard (`verinfer kms shard serve`), the explorer (its chain RPC, KMS shard and operator
are hostile peers: a drip, a 1 GiB answer, silence) and the fake EigenDA proxy. Attacks and
measurements: ``verinfer.testing.hostile`` (docs/budgets.md). Attackers connect from
127.0.0.2, the honest client and the /health probe from 127.0.0.1.

Prints, per service and attack: RSS growth (peak during the attack minus just before), /health
p99, data-directory growth, honest requests that succeeded meanwhile, whether an honest request
succeeds after, and what the attack's requests were answered. The last line is one JSON
object: ``rss_growth_mb_max`` (target <= 256), ``health_p99_ms_max`` (<= 250),
``disk_growth_mb_max`` (<= 64), ``honest_success_ratio`` (1.0), the same four without the
fake EigenDA proxy (``services_only``: it is a test double), ``over_budget`` (the cases past a
target), ``outbound`` (the operator and the explorer started against a hostile chain RPC) and
every case's row.

Usage (from the repository root): ``.venv/bin/python bench/hostile.py [--fast]
[--service operator ...] [--attack flood ...]``; the full scale takes about 7 minutes.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import sys
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from pathlib import Path

from verinfer.testing.hostile import (
    BUDGET,
    FAST,
    FULL,
    CaseResult,
    Service,
    explorer_against_rpc,
    explorer_service,
    fake_eigenda_service,
    kms_shard_service,
    operator_service,
    operator_start_against_rpc,
    run_case,
    scratch_dir,
    tiny_model,
)


def _services(work: Path) -> dict[str, Callable[[], AbstractContextManager[Service]]]:
    return {
        "operator": lambda: operator_service(tiny_model(work), work),
        "kms_shard": lambda: kms_shard_service(work),
        "explorer": lambda: explorer_service(work),
        "fake_eigenda": lambda: fake_eigenda_service(work),
    }


TEST_DOUBLES = {"fake_eigenda"}


def _overall(results: list[CaseResult]) -> dict[str, float]:
    honest_n = sum(r.honest_n for r in results)
    return {
        "rss_growth_mb_max": max((r.rss_growth_mb for r in results), default=0.0),
        "health_p99_ms_max": max((r.health_p99_ms for r in results), default=0.0),
        "disk_growth_mb_max": max((r.disk_growth_mb for r in results), default=0.0),
        "honest_success_ratio": round(sum(r.honest_ok for r in results) / honest_n, 4)
        if honest_n else 0.0,
    }


def _line(r: CaseResult) -> str:
    return (f"{r.service:13s} {r.attack:13s} RSS +{r.rss_growth_mb:6.1f} MB "
            f"(peak {r.rss_peak_mb:6.0f})  health p99 {r.health_p99_ms:7.1f} ms "
            f"(quiet {r.health_quiet_p99_ms:5.1f}, {r.health_failed}/{r.health_n} failed)  "
            f"CPU {r.cpu_share:4.2f}  disk +{r.disk_growth_mb:6.2f} MB  "
            f"honest {r.honest_ok}/{r.honest_n}  after {'ok' if r.recovered else 'DOWN'}  "
            f"answers {dict(sorted(r.answers.items()))}"
            + (f"  OVER: {'; '.join(r.over_budget())}" if r.over_budget() else ""))


@contextlib.contextmanager
def _workdir(keep: bool) -> Iterator[Path]:
    d = scratch_dir()
    try:
        yield d
    finally:
        if not keep:
            shutil.rmtree(d, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fast", action="store_true", help="the test suite's reduced scale")
    ap.add_argument("--service", action="append",
                    help="only these (repeatable): operator, kms_shard, explorer, fake_eigenda, "
                         "operator_rpc, explorer_rpc (started against a hostile chain RPC)")
    ap.add_argument("--attack", action="append", help="only these attacks (repeatable)")
    ap.add_argument("--keep", action="store_true", help="keep the scratch directory (logs)")
    args = ap.parse_args()
    scale = FAST if args.fast else FULL
    results: list[CaseResult] = []
    with _workdir(args.keep) as work:
        for name, start in _services(work).items():
            if args.service and name not in args.service:
                continue
            with start() as svc:
                for attack in svc.attacks:
                    if args.attack and attack not in args.attack:
                        continue
                    r = run_case(svc, attack, scale)
                    results.append(r)
                    print(_line(r), flush=True)
        outbound = []
        if not args.service or "operator_rpc" in args.service:
            for mode in ("drip", "huge"):
                state, took, seen, peak = operator_start_against_rpc(tiny_model(work), work,
                                                                     mode)
                outbound.append({"service": "operator", "peer": f"chain RPC ({mode})",
                                 "startup": state, "seconds": took, "peer_requests": seen,
                                 "rss_peak_mb": peak})
                print(f"operator      RPC {mode:9s} startup: {state} after {took} s "
                      f"({seen} RPC requests, RSS peak {peak:.0f} MB)", flush=True)
        if not args.service or "explorer_rpc" in args.service:
            for mode in ("drip", "huge"):
                said, took, seen, peak = explorer_against_rpc(work, mode)
                outbound.append({"service": "explorer", "peer": f"chain RPC ({mode})",
                                 "status_says": said, "seconds": took, "peer_requests": seen,
                                 "rss_peak_mb": peak})
                print(f"explorer      RPC {mode:9s} after {took} s its status says: {said!r} "
                      f"({seen} RPC requests, RSS peak {peak:.0f} MB)", flush=True)
        if args.keep:
            print(f"scratch directory: {work}", file=sys.stderr)
    over = [f"{r.service}/{r.attack}: {'; '.join(r.over_budget())}" for r in results
            if r.over_budget()]
    print(json.dumps({
        "scale": "fast" if args.fast else "full",
        **_overall(results),
        # the fake EigenDA proxy is a test double (never deployed): the same keys without it
        "services_only": _overall([r for r in results if r.service not in TEST_DOUBLES]),
        "targets": {"rss_growth_mb_max": BUDGET.rss_growth_mb,
                    "health_p99_ms_max": BUDGET.health_p99_ms,
                    "disk_growth_mb_max": BUDGET.disk_growth_mb,
                    "honest_success_ratio": BUDGET.honest_success},
        "over_budget": over,
        "outbound": outbound,
        "cases": [r.row() for r in results],
    }))


if __name__ == "__main__":
    main()
