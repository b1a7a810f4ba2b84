"""Opening disputes: a full challenge for a receipt in a committed batch, or an unpublished
claim for a signed receipt that no batch committed by its publication deadline contains.

A receipt reference is a receipt id (0x + 64 hex: the EIP-712 digest), a DA pointer (of the
receipt's ciphertext or of a one-receipt manifest), or a file holding a SignedReceipt JSON or
an API response's ``verification`` object.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from verinfer.chain.bindings import Contracts
from verinfer.chain.structs import (
    FINAL,
    ClaimStatus,
    Status,
    is_future_dated,
    publication_deadline,
)
from verinfer.da_client.pointer import Pointer
from verinfer.errors import VerinferError
from verinfer.protocol.hexutil import parse_hex, to_hex
from verinfer.protocol.jsonsafe import UntrustedJsonError, loads_untrusted
from verinfer.receipts.eip712 import RECEIPT_FIELDS, Domain
from verinfer.receipts.merkle import MerkleProof
from verinfer.receipts.signed import SignedReceipt
from verinfer.verifier.chain_view import BatchRecord, ChainView
from verinfer.verifier.enclave_judge import BlobSource
from verinfer.verifier.errors import ChallengeStateError, ReceiptRefError

#: Seconds of chain-clock advance tolerated between reading the head and the claim being mined.
FUTURE_MARGIN_S = 60
#: A receipt file or an operator's answer is a few KB; an n = 128 response with logprobs less
#: than this. One bound for every reader of a receipt REF (``read_ref_file``).
MAX_REF_BYTES = 4 << 20


@dataclass(frozen=True)
class Located:
    signed: SignedReceipt
    batch: BatchRecord | None
    proof: MerkleProof | None
    ciphertext: str | None


TYPED_DATA_KEYS = {"domain", "types", "primaryType", "message"}


def signed_from_json(d: Any, domain: Domain) -> SignedReceipt:
    """Parses every form a client may hold, for the chain's ``domain``:

    - an API response (``{"verification": {...}}``; choice 0 of an n > 1 response),
    - the response's ``verification`` object (``receipt`` = EIP-712 typed data, ``signature``,
      ``receipt_id``),
    - a bare SignedReceipt JSON (``receipt``, ``domain``, ``signature``, optional ``digest``),
    - a manifest entry (``receipt`` message, ``signature``, optional ``receiptDigest``).
    The receipt must be for ``domain`` and its signature must recover to its operator."""
    if isinstance(d, dict) and isinstance(d.get("verification"), dict):
        d = d["verification"]
    if not isinstance(d, dict) or "receipt" not in d or "signature" not in d:
        raise ReceiptRefError("expected a verification object, a signed receipt or an API "
                              f"response with a verification object, got {str(d)[:200]!r}",
                              param="ref")
    r = d["receipt"]
    claimed_id = d.get("receipt_id", d.get("receiptDigest", d.get("digest")))
    if isinstance(r, dict) and set(r) == TYPED_DATA_KEYS:
        if r["primaryType"] != "Receipt":
            raise ReceiptRefError(f"typed data of {r['primaryType']!r}, not a Receipt",
                                  param="primaryType")
        types = r["types"].get("Receipt") if isinstance(r["types"], dict) else None
        fields = [(f.get("name"), f.get("type")) if isinstance(f, dict) else f
                  for f in (types if isinstance(types, list) else [])]
        if fields != [(n, t) for n, t, _ in RECEIPT_FIELDS]:
            raise ReceiptRefError(f"typed data's Receipt type is not verinfer's: {fields}",
                                  param="types")
        signed = SignedReceipt.from_json({"receipt": r["message"], "domain": r["domain"],
                                          "signature": d["signature"]})
    elif "domain" in d:
        signed = SignedReceipt.from_json({k: d[k] for k in ("receipt", "domain", "signature",
                                                            "digest") if k in d})
    else:
        signed = SignedReceipt.from_json({"receipt": r, "domain": domain.to_json(),
                                          "signature": d["signature"]})
    if signed.domain != domain:
        raise ReceiptRefError(f"the receipt is signed for {signed.domain.to_json()}, not for "
                              f"this chain's {domain.to_json()}", param="domain")
    if claimed_id is not None and str(claimed_id).lower() != to_hex(signed.digest):
        raise ReceiptRefError(f"receipt id {claimed_id} does not match the receipt "
                              f"(0x{signed.digest.hex()})", param="receipt_id")
    # the chain rule (receipt chainId == domain chainId == this chain) and the signature
    signed.verify(chain_id=domain.chain_id)
    return signed


def read_ref_file(ref: str) -> Any:
    """The JSON of a receipt file REF (an API response, its ``verification`` object, a signed
    receipt), bounded: the one reader of such files (``locate`` here, the auditor's
    ``resolve_ref``), so both read the same files."""
    try:
        data = Path(ref).read_bytes()
    except OSError as e:
        raise ReceiptRefError(f"cannot read {ref[:200]}: {e.strerror}", param="ref") from None
    try:
        return loads_untrusted(data, max_bytes=MAX_REF_BYTES, what=ref[:200])
    except UntrustedJsonError as e:
        raise ReceiptRefError(f"{ref[:200]}: {e.message}", param="ref") from None


def locate(view: ChainView, da: BlobSource, ref: str) -> Located:
    """Finds the signed receipt and, if committed, its batch, proof and ciphertext pointer.
    A receipt is looked for only in its own operator's batches when REF names the receipt
    (a file); a manifest is read once per pointer, bounded by its batch's leafCount
    (``ChainView.manifest``)."""
    signed: SignedReceipt | None = None
    digest: bytes | None = None
    pointer: str | None = None
    path = Path(ref)
    if ref.startswith("da://"):
        pointer = str(Pointer.parse(ref))
    elif ref.startswith("0x") and len(ref) == 66:
        digest = parse_hex(ref, 32, "ref")
    elif path.is_file():
        try:
            signed = signed_from_json(read_ref_file(ref), view.domain)
        except (ValueError, VerinferError) as e:
            raise ReceiptRefError(f"{ref}: not a signed receipt JSON: {e}", param="ref") from e
        digest = signed.digest
    else:
        raise ReceiptRefError(f"{ref!r} is neither a receipt id, a DA pointer nor a file",
                              param="ref")
    operator = signed.receipt.operator.lower() if signed is not None else None
    for b in view.batches():
        if operator is not None and b.operator.lower() != operator:
            continue  # the contract looks a receipt up under its own operator's batches only
        try:
            m = view.manifest(da, b.manifest_pointer, b.leaf_count)
        except VerinferError:
            continue  # a missing or bad manifest is someone else's dispute
        for entry in m.entries:
            hit = (digest is not None and entry.signed.digest == digest) or \
                (pointer is not None and str(entry.ciphertext) == pointer)
            # the contract looks a receipt's batch up under the receipt's own operator: a copy
            # in another operator's batch proves nothing, and taking it would shadow the real one
            if hit and entry.signed.receipt.operator.lower() == b.operator.lower():
                return Located(signed or entry.signed, b, m.proof(entry.signed.digest),
                               str(entry.ciphertext))
    if signed is None:
        raise ReceiptRefError(f"{ref} is in no committed batch (pass the receipt file to "
                              "claim that it was withheld)", param="ref")
    return Located(signed, None, None, None)


class Challenger:
    def __init__(self, view: ChainView, contracts: Contracts, da: BlobSource, *,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.view, self.c, self.da = view, contracts, da
        self.sleep = sleep

    def pass_deadline(self, deadline: int, now: int) -> bool:
        """Whether the chain's clock was moved past ``deadline`` (chain time ``now``) so that
        the caller can act now. A real chain's clock moves by itself: False, the caller waits
        or refuses. (A devnet subclass moves anvil's clock:
        ``verinfer.testing.chain_clock.TimeTravelChallenger``.)"""
        return False

    def nudge(self, cid: int, info: Any) -> None:
        """Called on every poll of :meth:`wait` with the challenge's state; nothing to do on a
        real chain, whose blocks and clock move by themselves."""

    def open(self, loc: Located) -> tuple[str, int]:
        """('challenge', id) for a committed receipt, ('claim', id) for a withheld one. A
        future-dated receipt not in a batch is claimed at once (the contract slashes it)."""
        bond = self.c.config.params().challenge_bond
        if loc.batch is not None and loc.proof is not None:
            cid = self.c.challenges.open_challenge(
                loc.signed.receipt, loc.signed.signature, loc.batch.root, loc.proof.index,
                loc.proof.siblings, bond)
            return "challenge", cid
        p = self.c.config.params()
        _, ts = self.view.head()
        issued_at = loc.signed.receipt.issued_at
        # A receipt dated past the chain's clock + MAX_CLOCK_SKEW (up to 2^64 - 1) is invalid on
        # its face: claimUnpublished slashes it at once. Waiting for its publication deadline
        # would wait forever (the operator's aim in dating it so). FUTURE_MARGIN_S keeps the
        # claim valid when it is mined a little later than the head we read.
        if is_future_dated(issued_at, ts + FUTURE_MARGIN_S):
            return "claim", self.c.challenges.claim_unpublished(loc.signed.receipt,
                                                                loc.signed.signature, bond)
        publish_by = publication_deadline(issued_at, p.publication_deadline)
        if ts <= publish_by and not self.pass_deadline(publish_by, ts):
            raise ChallengeStateError(
                f"receipt 0x{loc.signed.digest.hex()} is not in a committed batch yet, but "
                f"its publication deadline ({publish_by}) has not passed (chain time {ts})")
        return "claim", self.c.challenges.claim_unpublished(loc.signed.receipt,
                                                            loc.signed.signature, bond)

    def status(self, kind: str, ident: int) -> dict[str, Any]:
        if kind == "claim":
            cl = self.c.challenges.claim(ident)
            return {"kind": "claim", "id": ident, "status": cl.status.name.lower(),
                    "receiptDigest": to_hex(cl.receipt_digest), "operator": cl.operator,
                    "responseDeadline": cl.response_deadline}
        info = self.c.challenges.challenge(ident)
        if info.status.name == "NONE":
            raise ChallengeStateError(f"no challenge {ident}", param="id")
        return {"kind": "challenge", "id": ident, "status": info.status.name.lower(),
                "receiptDigest": to_hex(info.receipt_digest), "operator": info.operator,
                "receiptOutHash": to_hex(info.receipt_out_hash),
                "majorityOutHash": to_hex(info.majority_out_hash),
                "members": info.members, "commits": info.commits, "reveals": info.reveals,
                "commitDeadline": info.commit_deadline, "revealDeadline": info.reveal_deadline,
                "committee": [m.account for m in self.c.challenges.committee(ident)]
                if info.members else []}

    def settle_claim(self, claim_id: int) -> ClaimStatus:
        """After the operator's response period: uphold an unanswered claim."""
        cl = self.c.challenges.claim(claim_id)
        _, ts = self.view.head()
        if cl.status is ClaimStatus.OPEN:
            if ts <= cl.response_deadline and not self.pass_deadline(cl.response_deadline, ts):
                return cl.status
            self.c.challenges.resolve_unpublished(claim_id)
        return self.c.challenges.claim(claim_id).status

    def wait(self, cid: int, *, timeout_s: float = 600.0, poll_s: float = 0.25,
             on_update: Callable[[dict[str, Any]], None] = lambda s: None) -> Status:
        """Follows a challenge to its end (:meth:`nudge` on every poll)."""
        deadline = time.monotonic() + timeout_s
        last: dict[str, Any] = {}
        while time.monotonic() < deadline:
            st = self.status("challenge", cid)
            if st != last:
                on_update(st)
                last = st
            info = self.c.challenges.challenge(cid)
            if info.status in FINAL:
                return info.status
            self.nudge(cid, info)
            self.sleep(poll_s)
        raise ChallengeStateError(f"challenge {cid} not resolved within {timeout_s}s")
