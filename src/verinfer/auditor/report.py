"""What `verinfer reproduce` reports: one line per step, then a verdict.

A step is ``ok``, ``warn`` (a fact the auditor should know that does not stop the replay, e.g.
"not in a committed batch yet"), ``fail`` (it ends the audit: the verdict says why) or
``skip`` (not checkable with what the auditor gave, e.g. no chain RPC). The verdict is one of
three, each with its exit code (docs/cookbook.md "Reading the result"):

- ``reproduced`` (0): the auditor's replay gives the receipt's outHash, byte for byte;
- ``mismatch`` (1): the operator's evidence is wrong — tokens differ at step k, the request
  is not what the client asked for, or the evidence is faulty (ciphertext hash, an envelope
  that opens under the right key but does not match); a challenge slashes it;
- ``cannot reproduce`` (2): the auditor lacks something (the ciphertext on DA, the right key,
  the model file, a matching engine) — nothing is said about the operator.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

StepStatus = Literal["ok", "warn", "fail", "skip"]
Outcome = Literal["reproduced", "mismatch", "cannot_reproduce"]

EXIT_CODES: dict[Outcome, int] = {"reproduced": 0, "mismatch": 1, "cannot_reproduce": 2}

#: The steps, in order (their names in the JSON report).
STEPS = ("signature", "batch", "ciphertext", "open", "environment", "replay")


@dataclass
class Step:
    name: str
    status: StepStatus
    detail: str
    data: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"step": self.name, "status": self.status, "detail": self.detail, **self.data}


@dataclass
class Verdict:
    outcome: Outcome
    reason: str = ""  # why, for mismatch and cannot_reproduce
    step: int | None = None  # first differing output step (mismatch in the tokens)
    token: int | None = None  # this machine's token at that step
    claimed_token: int | None = None  # the operator's token there (None: the claim ended)

    @property
    def exit_code(self) -> int:
        return EXIT_CODES[self.outcome]

    def text(self) -> str:
        if self.outcome == "reproduced":
            return "reproduced"
        if self.outcome == "mismatch":
            if self.step is not None:
                return f"mismatch at step {self.step}: {self.reason}"
            return f"mismatch: {self.reason}"
        return f"cannot reproduce: {self.reason}"


class Stop(Exception):  # control flow: the audit ends here
    """Raised by a step that decides the verdict before the replay."""

    def __init__(self, verdict: Verdict) -> None:
        super().__init__(verdict.text())
        self.verdict = verdict


def cannot(reason: str) -> Stop:
    return Stop(Verdict("cannot_reproduce", reason))


def mismatch(reason: str) -> Stop:
    return Stop(Verdict("mismatch", reason))


@dataclass
class Report:
    receipt_id: str | None = None
    steps: list[Step] = field(default_factory=list)
    verdict: Verdict = field(default_factory=lambda: Verdict("cannot_reproduce", "not run"))
    challenge_command: str | None = None  # printed on a mismatch: how to escalate
    facts: dict[str, Any] = field(default_factory=dict)  # tokens, ISA, timings

    def step(self, name: str) -> Step | None:
        return next((s for s in self.steps if s.name == name), None)

    def to_json(self) -> dict[str, Any]:
        v = self.verdict
        return {"receipt_id": self.receipt_id, "verdict": v.outcome, "summary": v.text(),
                "reason": v.reason, "mismatch_step": v.step, "token": v.token,
                "claimed_token": v.claimed_token, "exit_code": v.exit_code,
                "challenge_command": self.challenge_command,
                "steps": [s.to_json() for s in self.steps], **self.facts}
