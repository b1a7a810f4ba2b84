"""The in-enclave runner that obtains the epoch key from t-of-n KMS shards, runs one job and
wipes it, and the enclave child process. Quotes and their verification live below the KMS, in
``verinfer.attestation``. The only enclave implemented here is ``SoftwareEnclave``: it exercises
the whole protocol but is NOT a security boundary (see docs/kms.md)."""
