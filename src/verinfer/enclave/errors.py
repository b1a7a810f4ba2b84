"""Typed enclave errors (the runner's key release and jobs); the attestation errors a shard
reports when it refuses a quote live in ``verinfer.attestation.errors``. Domain errors: nothing
here knows HTTP."""

from __future__ import annotations

from verinfer.errors import VerinferError


class EnclaveError(VerinferError):
    code = "enclave_error"


class KeyReleaseError(EnclaveError):
    """Fewer than t valid shares could be obtained. ``refusals`` maps shard index -> reason
    code; ``corrupt_shards`` lists shards whose share failed the Feldman check."""

    code = "key_release_failed"

    def __init__(self, message: str, *, refusals: dict[int, str],
                 corrupt_shards: list[int]) -> None:
        super().__init__(message)
        self.refusals = refusals
        self.corrupt_shards = corrupt_shards


class JobError(EnclaveError):
    code = "job_failed"
