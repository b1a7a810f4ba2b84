"""verinfer: optimistic verifiable inference on a deterministic, batch-invariant engine."""

__version__ = "0.1.0"
