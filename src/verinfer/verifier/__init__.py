"""Verifier part: the in-enclave re-execution job, committee member node, light-audit worker,
watcher and challenge CLIs (docs/verifier.md)."""
