"""Attestation: what a quote is and how one is checked, below both the KMS and the enclave.

A KMS shard verifies quotes before it releases a share; the enclave runner produces them and asks
the shards. Both depend on this package, never on each other through it: ``quotes`` (the one
interface every TEE implements, measurements), ``software`` (the software attestation root: NOT
a security boundary), ``tdx`` (Intel TDX verification and a configfs-tsm attester), ``tee_gate``
(which TEEs a shard accepts, per key epoch) and ``errors`` (the refusal reasons a shard reports).
"""
