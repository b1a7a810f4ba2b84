"""Typed KMS errors. Every refusal carries a machine-readable reason in ``code``.

Shards answer refusals as ``{"error": {"reason": <code>, "message": ..., "shard_index": i}}``;
the codes are part of the wire protocol (docs/kms.md). These are domain errors: they say what
went wrong, not how an HTTP server answers it. The shard app (``kms/shard_app.py:
http_status``) is the one place that maps them to statuses — so, e.g., a tampered sealed file
(:class:`SealError`) is the shard's own failure, never "a 400 client error".
"""

from __future__ import annotations

from verinfer.errors import VerinferError


class KmsError(VerinferError):
    """Base of the KMS errors (malformed input, broken local state, refusals)."""

    code = "kms_error"


class InvalidShareError(KmsError):
    """A share, threshold or commitment list is malformed (wrong range, count or encoding)."""

    code = "invalid_share"


class ShareVerificationError(KmsError):
    """A share does not match the epoch's Feldman commitments. ``shard_index`` names the shard."""

    code = "share_verification_failed"

    def __init__(self, message: str, *, shard_index: int) -> None:
        super().__init__(message)
        self.shard_index = shard_index


class NotEnoughSharesError(KmsError):
    code = "not_enough_shares"


class SealError(KmsError):
    """A sealed file cannot be opened: wrong seal key, tampered file or wrong label."""

    code = "seal_error"


class EpochError(KmsError):
    code = "epoch_unknown"


class EpochExistsError(EpochError):
    code = "epoch_exists"


class EpochRetiredError(EpochError):
    code = "epoch_retired"


class RegistryError(KmsError):
    """The epoch registry or another config file is malformed."""

    code = "registry_invalid"


# ---- release refusals ---------------------------------------------------------------------
class ReleaseRefused(KmsError):
    code = "release_refused"


class BadReleaseRequest(ReleaseRefused):
    code = "bad_request"


class RequestTooLargeError(BadReleaseRequest):
    """A request body over the shard's size bound (refused before anything parses it)."""

    code = "request_too_large"


class NonceUnknownError(ReleaseRefused):
    code = "nonce_unknown"


class NonceExpiredError(ReleaseRefused):
    code = "nonce_expired"


class NonceReplayedError(ReleaseRefused):
    code = "nonce_replayed"


class ReportDataMismatchError(ReleaseRefused):
    """The quote does not bind this request's enclave key, nonces or requester."""

    code = "report_data_mismatch"


class RequesterSignatureError(ReleaseRefused):
    code = "requester_signature_invalid"


class NotCommitteeMemberError(ReleaseRefused):
    code = "not_committee_member"


class ThresholdEpochError(ReleaseRefused):
    """A share release asked for a per-receipt (threshold P-256) epoch: its shares never
    leave the shards; only per-envelope partial decryptions do (POST /v1/decrypt)."""

    code = "threshold_epoch"


class NotPerReceiptEpochError(BadReleaseRequest):
    """A per-receipt decryption asked for an epoch whose suite cannot be decapsulated by
    the shards (X25519, ML-KEM hybrid)."""

    code = "not_threshold_epoch"


class EncapsulationMalformedRefusal(BadReleaseRequest):
    """The target envelope's encapsulated key E is not a P-256 point other than the identity,
    or its proof of knowledge of log_G(E) is not two scalars below n."""

    code = "encapsulation_malformed"


class EncapsulationProofRefusal(BadReleaseRequest):
    """The target envelope's proof of knowledge of log_G(E) does not verify for that envelope
    and receipt: E (with its proof) was copied from another envelope, or the proof is forged.
    The shard never computes s_i·E for it."""

    code = "encapsulation_proof_invalid"


class EncapsulationReusedError(ReleaseRefused):
    """This shard already decrypted another envelope (another ciphertext hash) with the same
    encapsulated key E: a sealer reused its ephemeral key, and s·E would open both."""

    code = "encapsulation_reused"


class EncapsulationStoreError(KmsError):
    """The shard's own set of released encapsulated keys is unreadable (the shard's failure)."""

    code = "encapsulation_store_corrupt"


class AuditNotAssignedError(ReleaseRefused):
    """A light audit of a receipt the requester was not assigned (audits are drawn, never
    chosen by the auditor)."""

    code = "audit_not_assigned"


class RateLimitedError(ReleaseRefused):
    code = "rate_limited"


class KmsUnavailableError(KmsError):
    """The KMS cannot serve right now (capacity, its own share, the committee source, a
    shard); retry later or elsewhere."""

    code = "kms_unavailable"


class NonceCapacityError(KmsUnavailableError):
    code = "nonce_capacity"


class ShareUnavailableError(KmsUnavailableError):
    """This shard cannot open its own share of a live epoch (missing file or wrong seal key)."""

    code = "share_unavailable"


class CommitteeUnavailableError(KmsUnavailableError):
    """The committee source (the chain behind ``ChainCommitteeOracle``) cannot be read. The
    shard refuses with this reason; it never grants on a failed read."""

    code = "committee_unavailable"


class ShardUnavailableError(KmsUnavailableError):
    """A shard could not be reached or answered garbage (client side)."""

    code = "shard_unavailable"
