"""Attestation (quotes, measurements) and the in-enclave runner that obtains the epoch key from
t-of-n KMS shards. The only enclave implemented here is ``SoftwareEnclave``: it exercises the
whole protocol but is NOT a security boundary (see docs/kms.md)."""
