"""The explorer: a read-only web UI (and JSON API) over an incremental index of the contracts'
events, the batch manifests on DA, the light-audit reports on Redis and the KMS shards."""
