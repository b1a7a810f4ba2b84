"""The operator: an OpenAI-compatible API over the deterministic engine."""
