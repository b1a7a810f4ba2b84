"""POST /v1/completions (legacy text completions)."""
