"""Data availability: one DAClient interface (local, redis, eigenda-proxy backends), batch
manifests with Merkle inclusion proofs, and the durable publication outbox."""
