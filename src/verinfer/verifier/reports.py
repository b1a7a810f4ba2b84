"""Signed light-audit reports.

Report = RFC 8785 JSON {auditor, detail, issuedAt, jobId, matches, observedOutHash, reason,
receiptDigest, receiptOutHash, version}; reportHash = sha256(those bytes); signature = EIP-191
personal_sign over sha256("verinfer/audit-report/v1" || reportHash) by the auditor's account.
On chain, AuditLog.recordAudit(receiptDigest, observedOutHash, matches, reportHash) is sent by
the same account, so the transaction signature binds the auditor to the report hash too.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import rfc8785
from eth_account import Account
from eth_account.messages import encode_defunct
from eth_account.signers.local import LocalAccount

from verinfer.protocol.hexutil import parse_hex, to_hex
from verinfer.verifier.errors import AuditJobError
from verinfer.verifier.votes import Verdict

REPORT_LABEL = b"verinfer/audit-report/v1"


@dataclass(frozen=True)
class AuditReport:
    job_id: str
    receipt_digest: bytes
    auditor: str
    verdict: Verdict
    issued_at: int

    def body(self) -> dict[str, Any]:
        return {"version": 1, "jobId": self.job_id,
                "receiptDigest": to_hex(self.receipt_digest),
                "auditor": self.auditor, "observedOutHash": to_hex(self.verdict.vote),
                "receiptOutHash": to_hex(self.verdict.receipt_out_hash),
                "matches": self.verdict.agrees, "reason": self.verdict.reason,
                "detail": self.verdict.detail, "issuedAt": self.issued_at}

    def canonical(self) -> bytes:
        return bytes(rfc8785.dumps(self.body()))

    @property
    def report_hash(self) -> bytes:
        return hashlib.sha256(self.canonical()).digest()

    def signing_digest(self) -> bytes:
        return hashlib.sha256(REPORT_LABEL + self.report_hash).digest()


@dataclass(frozen=True)
class SignedAuditReport:
    report: AuditReport
    signature: bytes

    @classmethod
    def sign(cls, report: AuditReport, account: LocalAccount) -> SignedAuditReport:
        if account.address != report.auditor:
            raise AuditJobError(f"report names auditor {report.auditor}, signer is "
                                f"{account.address}", param="auditor")
        msg = encode_defunct(primitive=report.signing_digest())
        return cls(report, bytes(account.sign_message(msg).signature))

    def verify(self) -> str:
        """Returns the signer; raises AuditJobError unless it is the report's auditor."""
        msg = encode_defunct(primitive=self.report.signing_digest())
        try:
            signer = str(Account.recover_message(msg, signature=self.signature))
        except Exception as e:  # eth-account raises ValueError/BadSignature on junk
            raise AuditJobError(f"audit report signature does not parse: {e}",
                                param="signature") from e
        if signer != self.report.auditor:
            raise AuditJobError(f"audit report signed by {signer}, not by its auditor "
                                f"{self.report.auditor}", param="signature")
        return signer

    def to_json(self) -> dict[str, Any]:
        return {"report": self.report.body(), "reportHash": to_hex(self.report.report_hash),
                "signature": to_hex(self.signature)}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> SignedAuditReport:
        try:
            b = d["report"]
            verdict = Verdict(parse_hex(b["observedOutHash"], 32, "observedOutHash"),
                              b["reason"], parse_hex(b["receiptOutHash"], 32, "receiptOutHash"),
                              detail=b["detail"])
            rep = AuditReport(b["jobId"], parse_hex(b["receiptDigest"], 32, "receiptDigest"),
                              b["auditor"], verdict, int(b["issuedAt"]))
            out = cls(rep, parse_hex(d["signature"], None, "signature"))
        except (KeyError, TypeError, ValueError) as e:
            raise AuditJobError(f"malformed audit report {dict(d)!r:.200}: {e}") from e
        if rep.verdict.agrees != b["matches"] or to_hex(rep.report_hash) != d["reportHash"]:
            raise AuditJobError("audit report fields do not match its hash", param="reportHash")
        return out
