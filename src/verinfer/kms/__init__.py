"""Threshold key management: Shamir/Feldman shares of the epoch secret, key epochs, and the
KMS shard service that releases a share only to a genuine, fresh, authorized enclave."""
