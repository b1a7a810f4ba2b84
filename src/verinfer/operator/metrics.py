"""Prometheus metrics of the operator (one registry per app, so tests can run several).

Labels are bounded by construction: ``route`` is a route *template* (or ``unmatched`` /
``unrouted``), never a client-chosen path, and ``status`` is one of the codes in
:data:`STATUSES` (anything else is ``other``). So /metrics leaks no path, receipt id or
anything else a client sent, and its size does not grow with traffic (issue 24.5).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

STATUSES = frozenset({"200", "400", "401", "403", "404", "405", "408", "413", "422", "429",
                      "500", "503"})


class OperatorMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter("verinfer_requests_total",
                                "HTTP requests by route template and status",
                                ["route", "status"], registry=self.registry)
        self.latency = Histogram("verinfer_request_seconds", "End-to-end request latency",
                                 ["route"], registry=self.registry,
                                 buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60))
        self.tokens = Counter("verinfer_tokens_total", "Tokens processed", ["kind"],
                              registry=self.registry)
        self.evidence_latency = Histogram(
            "verinfer_evidence_seconds", "Receipt + envelope + durable outbox write per response",
            registry=self.registry,
            buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.5))
        self.in_flight = Gauge("verinfer_requests_in_flight", "Requests being served",
                               registry=self.registry)
        self.ready = Gauge("verinfer_ready", "1 while the operator signs receipts, 0 while a "
                           "blocker (see /health) stops it", registry=self.registry)
        self.ready.set(1)
        self.refused_not_ready = Counter(
            "verinfer_refused_not_ready_total",
            "Completions refused with 503 because the operator could not honour a receipt",
            registry=self.registry)
        self.unsafe = Gauge("verinfer_unsafe_modes", "Production-unsafe modes this server runs "
                            "in (0 in production; reasons in /health)", registry=self.registry)

    def watch_claims(self, counts: Callable[[], Any]) -> None:
        """Export the claim responder's totals (``counts()`` -> ClaimCounts) at each scrape."""
        self.registry.register(_ClaimsCollector(counts))

    def count(self, route: str, status: int) -> None:
        code = str(status)
        self.requests.labels(route, code if code in STATUSES else "other").inc()


class _ClaimsCollector(Collector):
    """Unpublished claims against this operator (``operator/claims.py``): seen, answered and
    failed (counted from its state file, so they survive restarts), open now, and failed
    attempts of this process."""

    def __init__(self, counts: Callable[[], Any]) -> None:
        self.counts = counts

    def collect(self) -> Iterator[Any]:
        c = self.counts()
        total = CounterMetricFamily("verinfer_unpublished_claims",
                                    "Unpublished claims against this operator by outcome "
                                    "(failed: not answered in time, stake at risk)",
                                    labels=["outcome"])
        for outcome in ("seen", "answered", "failed"):
            total.add_metric([outcome], getattr(c, outcome))
        yield total
        yield GaugeMetricFamily("verinfer_unpublished_claims_open",
                                "Unpublished claims waiting for this operator's answer",
                                value=c.open)
        yield CounterMetricFamily("verinfer_unpublished_claim_errors",
                                  "Failed steps or answer attempts of the claim responder "
                                  "(retried)", value=c.errors)
