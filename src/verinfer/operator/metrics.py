"""Prometheus metrics of the operator (one registry per app, so tests can run several)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram


class OperatorMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter("verinfer_requests_total", "HTTP requests by route and status",
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
