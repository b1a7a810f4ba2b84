"""Typed errors of the data-availability client. Each names the offending value.

Domain errors: :class:`~verinfer.errors.BadInputError` where the caller handed in something
wrong, plain :class:`DAError` where a backend or the local outbox failed. HTTP statuses are
chosen at the edges (``verinfer.operator.errors``), not here.
"""

from __future__ import annotations

from verinfer.errors import BadInputError, VerinferError


class DAError(VerinferError):
    """A backend or the local outbox failed (not the caller's fault)."""

    code = "da_error"


class MalformedPointerError(BadInputError):
    """A DA pointer string or value does not follow ``da://<backend>/0x<hex>``."""

    code = "malformed_da_pointer"


class BlobTooLargeError(BadInputError):
    """A blob exceeds the backend's size limit; nothing was uploaded."""

    code = "da_blob_too_large"


class BlobNotFoundError(BadInputError):
    """No blob is stored under the pointer (never published, or expired after retention)."""

    code = "da_blob_not_found"


class BackendMismatchError(BadInputError):
    """A pointer of one backend was handed to a client of another."""

    code = "da_backend_mismatch"


class ManifestError(BadInputError):
    """A batch manifest is malformed, non-canonical, or its root does not match its entries."""

    code = "invalid_batch_manifest"


class CommitmentMismatchError(DAError):
    """Bytes returned by a backend do not hash to the pointer's commitment: corruption or a
    lying backend. The bytes are never handed to the caller."""

    code = "da_commitment_mismatch"


class DAUnavailableError(DAError):
    """The backend could not be reached or refused to store (EigenDA proxy 503). Retryable;
    the caller should retry with backoff or fail over to another backend."""

    code = "da_unavailable"


class OutboxError(DAError):
    """The publication outbox refused an operation (bad entry, conflicting duplicate, busy)."""

    code = "outbox_error"


class OutboxConflictError(OutboxError):
    """An entry with the same receipt digest but different bytes is already queued."""

    code = "outbox_conflict"


class PublisherBusyError(OutboxError):
    """Another publisher already holds this outbox's publisher lock."""

    code = "outbox_publisher_busy"


class DAProtocolError(DAError):
    """A backend answered outside its protocol (unexpected status, empty certificate)."""

    code = "da_protocol_error"
