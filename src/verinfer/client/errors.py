"""The client's errors: a failed check of an answer, and a client that is set up wrong."""

from __future__ import annotations

from verinfer.errors import BadInputError, VerinferError

#: Every check :class:`~verinfer.client.verify.Verifier` runs, in the order it runs them
#: (docs/client.md says what each protects against).
CHECKS = ("format", "chain_id", "contract", "signature", "operator", "issued_at", "model",
          "fingerprint", "coverage", "key_epoch", "request", "output", "tool_calls", "content",
          "choices", "chain")


class VerificationError(VerinferError):
    """An answer failed a check: ``check`` names it (one of :data:`CHECKS`), ``choice`` the
    response choice (None: the response as a whole), ``receipt_id`` the receipt when known.
    Not the caller's fault: the operator's answer (or something between it and the app) is
    wrong, or — ``chain`` — the chain could not be read to decide."""

    code = "verification_failed"

    def __init__(self, check: str, message: str, *, choice: int | None = None,
                 receipt_id: str | None = None) -> None:
        if check not in CHECKS:
            raise ValueError(f"unknown check {check!r}")
        where = f" (choice {choice})" if choice is not None else ""
        super().__init__(f"{check}{where}: {message}", param=check, code=self.code)
        self.check, self.choice, self.receipt_id = check, choice, receipt_id


class VerificationWarning(UserWarning):
    """What the ``warn`` policy emits instead of raising; ``.error`` is the VerificationError."""

    def __init__(self, error: VerificationError) -> None:
        super().__init__(str(error))
        self.error = error


class ClientConfigError(BadInputError):
    """The verified client was set up wrong (no chain settings, the RPC serves another chain,
    a model file that cannot be read)."""

    code = "client_config"
