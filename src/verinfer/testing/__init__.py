"""Test doubles shared by the tests and the benchmarks: a fake EigenDA proxy (a real HTTP server
with the proxy's REST API and failure injection) and sample signed receipts / outbox entries.

They live outside the production packages so that no production path can reach them: the
import-layer check (docs/architecture.md, layer 10) fails on any import of ``verinfer.testing``
from the layers below.
"""
