"""Typed attestation and enclave errors; ``code`` is the machine-readable reason a shard
reports when it refuses a quote. Domain errors: the KMS shard app maps them to HTTP statuses
(``verinfer.kms.shard_app.http_status``), nothing here knows HTTP."""

from __future__ import annotations

from verinfer.errors import VerinferError


class AttestationError(VerinferError):
    """A quote is not acceptable (malformed, forged, expired, foreign measurement)."""

    code = "quote_invalid"


class QuoteMalformedError(AttestationError):
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


class RootKeyError(VerinferError):
    """An attestation root key file is missing or malformed."""

    code = "root_key_invalid"


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
