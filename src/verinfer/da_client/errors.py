"""Typed errors of the data-availability client. Each names the offending value."""

from __future__ import annotations

from verinfer.errors import ClientError, ServerError


class MalformedPointerError(ClientError):
    """A DA pointer string or value does not follow ``da://<backend>/0x<hex>``."""

    code = "malformed_da_pointer"


class BlobTooLargeError(ClientError):
    """A blob exceeds the backend's size limit; nothing was uploaded."""

    status_code = 413
    code = "da_blob_too_large"


class BlobNotFoundError(ClientError):
    """No blob is stored under the pointer (never published, or expired after retention)."""

    status_code = 404
    code = "da_blob_not_found"


class BackendMismatchError(ClientError):
    """A pointer of one backend was handed to a client of another."""

    code = "da_backend_mismatch"


class ManifestError(ClientError):
    """A batch manifest is malformed, non-canonical, or its root does not match its entries."""

    code = "invalid_batch_manifest"


class CommitmentMismatchError(ServerError):
    """Bytes returned by a backend do not hash to the pointer's commitment: corruption or a
    lying backend. The bytes are never handed to the caller."""

    status_code = 502
    code = "da_commitment_mismatch"


class DAUnavailableError(ServerError):
    """The backend could not be reached or refused to store (EigenDA proxy 503). Retryable;
    the caller should retry with backoff or fail over to another backend."""

    status_code = 503
    code = "da_unavailable"


class OutboxError(ServerError):
    """The publication outbox refused an operation (bad entry, conflicting duplicate, busy)."""

    code = "outbox_error"


class OutboxConflictError(OutboxError):
    """An entry with the same receipt digest but different bytes is already queued."""

    status_code = 409
    code = "outbox_conflict"


class PublisherBusyError(OutboxError):
    """Another publisher already holds this outbox's publisher lock."""

    code = "outbox_publisher_busy"


class DAProtocolError(ServerError):
    """A backend answered outside its protocol (unexpected status, empty certificate)."""

    status_code = 502
    code = "da_protocol_error"
