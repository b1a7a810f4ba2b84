"""Test doubles shared by the tests, the benchmarks and the devnet checks: a fake EigenDA proxy (a
real HTTP server with the proxy's REST API and failure injection), sample signed receipts /
outbox entries, an in-memory batch sink, the evidence factory (an operator's receipts, honest or
cheating, issued through the operator's own ``ReceiptIssuer``) and seeded model families.

They live outside the production packages so that no production path can reach them: the
import-layer check (the layer table of docs/architecture.md) fails on any import of
``verinfer.testing`` from the layers below.
"""
