"""Typed errors of the verifier part: domain errors on the one tree (:mod:`verinfer.errors`).

Each says only whose fault it is; the verifier has no HTTP surface, and its CLIs exit 2 for the
caller's fault (a bad receipt reference, faulty evidence, a step the challenge's state does not
allow) and 1 for its own (:mod:`verinfer.cli_errors`)."""

from __future__ import annotations

from verinfer.errors import BadInputError, VerinferError


class VerifierError(VerinferError):
    """The verifier could not do its job (infrastructure, not a verdict)."""

    code = "verifier_error"


class CannotJudgeError(VerifierError):
    """This verifier's engine cannot re-execute the request (other model or tokenizer): it
    abstains rather than vote on something it cannot reproduce."""

    code = "cannot_judge"


class LocalFault(VerifierError):
    """This verifier's OWN side failed — its RPC, its DA connection, its KMS quorum, or DA
    not (yet) serving a blob inside the publication window. The evidence may be fine, so
    this is never a vote: the node retries with backoff until the commit deadline."""

    code = "local_fault"


class EvidenceUnavailableError(LocalFault):
    """The DA backend did not answer (transient): retry later, do not vote yet."""

    code = "evidence_unavailable"


class OperatorFault(BadInputError):
    """The evidence the OPERATOR controls is faulty (manifest missing after the publication
    window, malformed, not matching the on-chain root, ...). Deterministic for every honest
    member, so it is decided by a vote (INVALID_EVIDENCE), never by abstaining — abstention
    is what a cheating operator would want (an inconclusive challenge costs it nothing)."""

    code = "operator_fault"

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason  # one of votes.REASONS


class ReceiptRefError(BadInputError):
    """A receipt reference (id, DA pointer or file) could not be resolved."""

    code = "receipt_ref_error"


class AuditJobError(BadInputError):
    """An audit job on the stream is malformed."""

    code = "audit_job_malformed"


class ChallengeStateError(BadInputError):
    """A challenge is not in a state that allows the requested step."""

    code = "challenge_state"
