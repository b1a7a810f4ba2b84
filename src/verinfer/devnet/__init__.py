"""One-command local network: anvil + contracts + KMS shards + DA + operator + verifiers
(docs/devnet.md)."""
