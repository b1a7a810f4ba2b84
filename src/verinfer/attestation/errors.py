"""Typed attestation errors; ``code`` is the machine-readable reason a shard reports when it
refuses a quote. Domain errors: the KMS shard app, a layer above, maps them to HTTP statuses;
nothing here knows HTTP (or the KMS)."""

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
