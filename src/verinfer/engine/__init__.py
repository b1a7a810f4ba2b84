"""Deterministic, batch-invariant inference (docs/architecture.md, docs/engine.md)."""
