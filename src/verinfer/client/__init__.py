"""The verified client (docs/client.md): drop-in ``openai`` clients that check every answer's
receipt — signature, staked operator, chain and contract, the request this client sent, the
bytes it received, issuedAt, model, fingerprint, coverage — before the app sees it; and a
keeper that follows each accepted receipt until it is final, filing the unpublished claim
when its operator misses a deadline."""

from verinfer.client.errors import (
    CHECKS,
    ClientConfigError,
    VerificationError,
    VerificationWarning,
)
from verinfer.client.keeper import Keeper, KeeperPolicy, KeeperStatus
from verinfer.client.models import ClientModel
from verinfer.client.openai_client import AsyncVerifiedOpenAI, Policy, VerifiedOpenAI
from verinfer.client.receipt_store import ReceiptStore, State
from verinfer.client.verify import Checked, Received, ReceivedCall, Verifier

__all__ = [
    "CHECKS",
    "AsyncVerifiedOpenAI",
    "Checked",
    "ClientConfigError",
    "ClientModel",
    "Keeper",
    "KeeperPolicy",
    "KeeperStatus",
    "Policy",
    "ReceiptStore",
    "Received",
    "ReceivedCall",
    "State",
    "VerificationError",
    "VerificationWarning",
    "VerifiedOpenAI",
    "Verifier",
]
