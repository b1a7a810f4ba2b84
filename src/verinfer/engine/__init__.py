"""Deterministic, batch-invariant inference (see DESIGN §3 and docs/engine.md)."""
