"""Typed attestation and enclave errors; ``code`` is the machine-readable reason a shard
reports when it refuses a quote."""

from __future__ import annotations

from verinfer.errors import ClientError, ServerError


class AttestationError(ClientError):
    status_code = 403
    code = "quote_invalid"


class QuoteMalformedError(AttestationError):
    status_code = 400
    code = "quote_malformed"


class UnsupportedTeeError(AttestationError):
    code = "tee_unsupported"


class QuoteSignatureError(AttestationError):
    """The quote's signature chain does not lead to a pinned root (forged or foreign quote)."""

    code = "quote_signature_invalid"


class QuoteExpiredError(AttestationError):
    code = "quote_expired"


class MeasurementNotAllowedError(AttestationError):
    code = "measurement_not_allowed"


class RootKeyError(ClientError):
    """An attestation root key file is missing or malformed."""

    code = "root_key_invalid"


class EnclaveError(ServerError):
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
