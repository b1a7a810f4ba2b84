"""Typed errors of the verifier part."""

from __future__ import annotations

from verinfer.errors import ClientError, ServerError


class VerifierError(ServerError):
    """The verifier could not do its job (infrastructure, not a verdict)."""

    code = "verifier_error"


class CannotJudgeError(VerifierError):
    """This verifier's engine cannot re-execute the request (other model or tokenizer): it
    abstains rather than vote on something it cannot reproduce."""

    code = "cannot_judge"


class EvidenceUnavailableError(VerifierError):
    """The DA backend did not answer (transient): retry later, do not vote yet."""

    code = "evidence_unavailable"


class ReceiptRefError(ClientError):
    """A receipt reference (id, DA pointer or file) could not be resolved."""

    code = "receipt_ref_error"


class AuditJobError(ClientError):
    """An audit job on the stream is malformed."""

    code = "audit_job_malformed"


class ChallengeStateError(ClientError):
    """A challenge is not in a state that allows the requested step."""

    status_code = 409
    code = "challenge_state"
