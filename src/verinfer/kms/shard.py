"""One KMS shard: issues nonces and releases its share of an epoch secret to an enclave that
passes the release policy. Transport-free logic here; HTTP in ``shard_app``.

Release policy, checked in this order (the first failure is the refusal reason):
 1. request well-formed                       -> bad_request
 2. epoch registered and live                 -> epoch_unknown / epoch_retired
 3. our nonce in the request: MAC'd by us since our start, unexpired -> nonce_unknown /
    nonce_expired (stateless; nothing is spent yet)
 4. quote: signature chain to a pinned root, age, measurement allowlisted -> quote_*,
    measurement_not_allowed
 5. quote report_data == report_data(request) (binds enclave key, nonces, requester, purpose)
                                              -> report_data_mismatch
 6. requester signature over the report_data  -> requester_signature_invalid
 7. our nonce not spent by a *different* request -> nonce_replayed
 8. token bucket of the requester, charged once per nonce (a repeat of the same request is
    free, so whoever sees a body cannot drain the requester's bucket by replaying it)
                                              -> rate_limited
 9. full_challenge: requester drawn for the open challenge; light_audit: registered verifier
                                              -> not_committee_member / committee_unavailable
    per-receipt decryption (``target`` present, threshold epochs only): full_challenge: the
    open challenge disputes exactly the target receipt (on-chain receiptDigest == EIP-712
    digest of the receipt in the request under the shard's own deployment domain);
    light_audit: that receipt's audit was assigned to the requester
                                              -> not_committee_member / audit_not_assigned
    Then, before s_i·E: the sealer's proof of knowledge of log_G(E) verifies for the target
    envelope and receipt (encapsulation_malformed / encapsulation_proof_invalid), and this
    shard never decrypted another envelope with the same E (encapsulation_reused).
A share release for a threshold epoch is refused (threshold_epoch, checked with 2): its
shares never leave the shard; a target for a legacy epoch is not_threshold_epoch.
Then the nonce is spent, bound to this request's report_data, with the signed release: the
same request again gets the same release (idempotent; only the attested enclave can open it).
Why the nonce is spent last: an altered copy of a genuine body fails 4-6 and must not burn the
genuine request's nonce. Every decision of an *authenticated* request (checks 1-6 passed: an
allowlisted enclave's quote binding this request, signed by its requester) is appended to the
release log; a refusal before that is counted in the metrics only (``on_decision``): it says
nothing about anyone (the requester is unauthenticated), and logging it let one client append
~1.7 KB, fsync'd, per request.
"""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PublicKey
from eth_account.signers.local import LocalAccount

from verinfer.attestation.quotes import AttestationPolicy, QuoteVerifier, VerifiedQuote
from verinfer.errors import VerinferError
from verinfer.kms import tdh
from verinfer.kms.allowlist import MeasurementAllowlist
from verinfer.kms.committee import CommitteeOracle
from verinfer.kms.encapsulations import FILE_NAME as ENCAPSULATIONS_FILE
from verinfer.kms.encapsulations import ReleasedEncapsulations
from verinfer.kms.epochs import EpochRegistry, require_live
from verinfer.kms.errors import (
    AuditNotAssignedError,
    BadReleaseRequest,
    EncapsulationMalformedRefusal,
    EncapsulationProofRefusal,
    NotCommitteeMemberError,
    NotPerReceiptEpochError,
    ReportDataMismatchError,
    RequesterSignatureError,
    SealError,
    ShareUnavailableError,
    ThresholdEpochError,
)
from verinfer.kms.identity import recover_eip191_signer, sign_eip191
from verinfer.kms.keygen import share_label, share_path
from verinfer.kms.nonces import NonceBook, NonceGrant, Spend
from verinfer.kms.protocol import (
    ANY_AUDITOR,
    TRANSPORT_SUITE,
    Release,
    ReleaseRequest,
    dleq_context,
    partial_info,
    release_digest,
    requester_digest,
    share_info,
)
from verinfer.kms.ratelimit import TokenBucketLimiter
from verinfer.kms.release_log import ReleaseLog
from verinfer.kms.sealing import read_sealed
from verinfer.receipts.envelope import split_envelope
from verinfer.receipts.epoch_keys import EnvelopeSuite
from verinfer.receipts.errors import (
    EncapsulationMalformedError,
    EncapsulationProofError,
    EnvelopeDecryptionError,
)


@dataclass
class ShardConfig:
    index: int
    data_dir: Path
    seal_key: bytes
    identity: LocalAccount
    epochs: EpochRegistry
    quote_verifier: QuoteVerifier
    allowlist: MeasurementAllowlist
    software_roots: frozenset[bytes]
    committee: CommitteeOracle
    release_log: ReleaseLog
    now: Callable[[], float]
    nonce_ttl_s: float = 30.0
    quote_max_age_s: float = 60.0
    rate_capacity: float = 10.0
    rate_refill_per_s: float = 1.0
    #: addresses whose signed AuditAssignments authorize per-receipt light audits
    audit_schedulers: frozenset[str] = frozenset()


#: Log reason of a release that repeats an earlier answer to the identical request.
REPEAT = "repeat_of_identical_request"


@dataclass(frozen=True)
class Decision:
    released: bool
    reason: str


class ShardService:
    def __init__(self, cfg: ShardConfig) -> None:
        self.cfg = cfg
        self.index = cfg.index
        self.address = cfg.identity.address.lower()
        self.nonces = NonceBook(cfg.nonce_ttl_s, cfg.now, shard_index=cfg.index)
        self.limiter = TokenBucketLimiter(cfg.rate_capacity, cfg.rate_refill_per_s, cfg.now)
        #: every (epoch, E) this shard decrypted for, with its envelope's hash (durable)
        self.encapsulations = ReleasedEncapsulations(cfg.data_dir / ENCAPSULATIONS_FILE)

    def issue_nonce(self) -> NonceGrant:
        return self.nonces.issue()

    def release(self, body: object,
                on_decision: Callable[[Decision], None] | None = None, *,
                unparsable: VerinferError | None = None) -> Release:
        """Apply the policy to a JSON body; return the signed release or raise the refusal.
        ``unparsable``: the body could not be parsed (refused and logged like any request)."""
        req: ReleaseRequest | None = None
        quote: VerifiedQuote | None = None

        def authenticated(q: VerifiedQuote) -> None:
            nonlocal quote
            quote = q

        try:
            if unparsable is not None:
                raise unparsable
            req = ReleaseRequest.from_json(body)
            _, prior = self._authorize(req, authenticated)
            if prior is not None:
                release, decision = prior.release, Decision(True, REPEAT)
            else:
                answer = (self._encrypt_and_sign(req) if req.target is None
                          else self._partial_and_sign(req))
                release = self.nonces.spend(req.nonces[self.index], req.report_data(), answer)
                decision = Decision(True, "released")
        except VerinferError as e:
            if quote is not None:  # authenticated: logged; before that, metrics only
                self._log(req, quote, Decision(False, e.code or type(e).__name__))
            if on_decision:
                on_decision(Decision(False, e.code or type(e).__name__))
            raise
        self._log(req, quote, decision)
        if on_decision:
            on_decision(decision)
        return release

    def _authorize(self, req: ReleaseRequest,
                   authenticated: Callable[[VerifiedQuote], None] = lambda q: None,
                   ) -> tuple[VerifiedQuote, Spend | None]:
        cfg = self.cfg
        record = require_live(cfg.epochs, req.epoch)
        suite = EnvelopeSuite.parse(record.suite)
        if req.target is None and suite.threshold_decapsulable:
            raise ThresholdEpochError(
                f"epoch {req.epoch} is a per-receipt epoch ({record.suite}): its shares are "
                "never released; ask POST /v1/decrypt for one receipt")
        if req.target is not None:
            if not suite.threshold_decapsulable:
                raise NotPerReceiptEpochError(
                    f"epoch {req.epoch} ({record.suite}) cannot be decrypted per receipt")
            if req.target.receipt.key_epoch != req.epoch:
                raise BadReleaseRequest(
                    f"target receipt is of epoch {req.target.receipt.key_epoch}, the request "
                    f"names {req.epoch}", param="target")
        ours = req.nonces.get(self.index)
        if ours is None:
            raise BadReleaseRequest(f"request carries no nonce for shard {self.index}",
                                    param="nonces")
        self.nonces.check(ours)
        policy = AttestationPolicy(allowed_measurements=cfg.allowlist.allowed(),
                                   max_age_s=cfg.quote_max_age_s, now=cfg.now,
                                   software_roots=cfg.software_roots, epoch=req.epoch)
        verified = cfg.quote_verifier.verify(req.quote, policy)
        rd = req.report_data()
        if verified.report_data != rd:
            raise ReportDataMismatchError(
                "quote report_data does not bind this request's enclave key, nonces and "
                f"requester (quote 0x{verified.report_data.hex()[:16]}…, "
                f"request 0x{rd.hex()[:16]}…)")
        try:
            signer = recover_eip191_signer(requester_digest(rd), req.requester_signature)
        except ValueError as e:
            raise RequesterSignatureError(f"requester signature: {e}") from e
        if signer != req.requester:
            raise RequesterSignatureError(
                f"requester signature is by {signer}, not {req.requester}")
        authenticated(verified)  # checks 1-6 passed: from here every decision is logged
        prior = self.nonces.spent(ours, rd)
        if prior is None:
            self.limiter.take(req.requester)
        # The committee is asked again on a repeat: a challenge resolved in between ends it.
        if req.target is not None:
            self._authorize_receipt(req)
        elif req.purpose == "full_challenge":
            if not cfg.committee.is_committee_member(req.challenge_id, req.requester):
                raise NotCommitteeMemberError(
                    f"{req.requester} is not on the committee of an open challenge "
                    f"{req.challenge_id}")
        elif not cfg.committee.is_registered_verifier(req.requester):
            raise NotCommitteeMemberError(f"{req.requester} is not a registered verifier")
        return verified, prior

    def _authorize_receipt(self, req: ReleaseRequest) -> None:
        assert req.target is not None
        committee = self.cfg.committee
        receipt = req.target.receipt
        rid = req.target.receipt_hash.hex()
        if req.purpose == "full_challenge":
            if not committee.is_committee_member(req.challenge_id, req.requester):
                raise NotCommitteeMemberError(
                    f"{req.requester} is not on the committee of an open challenge "
                    f"{req.challenge_id}")
            # read after membership: a challenge resolved in between is no challenge
            if not committee.challenge_covers(req.challenge_id, receipt):
                raise NotCommitteeMemberError(
                    f"challenge {req.challenge_id} does not dispute receipt 0x{rid}")
        elif not (self._assigned_by_scheduler(req)
                  or committee.is_audit_assigned(req.requester, receipt)):
            raise AuditNotAssignedError(
                f"{req.requester} holds no light-audit assignment for receipt 0x{rid}")

    def _assigned_by_scheduler(self, req: ReleaseRequest) -> bool:
        """A valid, unexpired assignment of this receipt to this requester (or to any
        registered verifier) signed by one of our audit schedulers."""
        a, target = req.assignment, req.target
        if a is None or target is None or not self.cfg.audit_schedulers:
            return False
        try:
            signer = recover_eip191_signer(a.digest(), a.signature)
        except ValueError:
            return False
        if signer not in self.cfg.audit_schedulers or a.receipt_hash != target.receipt_hash \
                or a.expires_at < self.cfg.now():
            return False
        if a.auditor == ANY_AUDITOR:
            return self.cfg.committee.is_registered_verifier(req.requester)
        return a.auditor == req.requester

    def _partial_and_sign(self, req: ReleaseRequest) -> Release:
        """D_i = s_i·E with its DLEQ proof, encrypted to the enclave; E is read from the
        target's ciphertext (already checked against the receipt's ciphertextHash)."""
        assert req.target is not None
        # split_envelope checks the sealer's proof of knowledge of log_G(E), bound to this
        # envelope and receipt, before we touch E: a foreign E (copied from another envelope
        # with its proof) is refused here, never multiplied by our share.
        try:
            _, enc, _ = split_envelope(req.target.ciphertext, req.target.receipt,
                                       EnvelopeSuite.P256)
        except EncapsulationMalformedError as e:
            raise EncapsulationMalformedRefusal(f"target: {e.message}", param="target") from e
        except EncapsulationProofError as e:
            raise EncapsulationProofRefusal(f"target: {e.message}", param="target") from e
        except EnvelopeDecryptionError as e:
            raise BadReleaseRequest("target ciphertext is not a P256 envelope of its receipt",
                                    param="target") from e
        # E proven by its sealer, but the sealer could prove it again for another envelope
        self.encapsulations.claim(req.epoch, enc, req.target.ciphertext_hash)
        buf = self._own_share(req.epoch)
        rd = req.report_data()
        try:
            share = tdh.ScalarShare(self.index, int.from_bytes(buf, "big"))
            partial = tdh.partial_decapsulate(share, enc, dleq_context(rd, self.index),
                                              secrets.randbelow)
        except tdh.PointError as e:
            raise BadReleaseRequest(f"target: {e.message}", param="target") from e
        finally:
            buf[:] = bytes(len(buf))
        ct = TRANSPORT_SUITE.encrypt(partial, X25519PublicKey.from_public_bytes(
            req.enclave_public_key), info=partial_info(req.epoch, self.index, rd))
        return self._signed_release(req.epoch, rd, ct)

    def _encrypt_and_sign(self, req: ReleaseRequest) -> Release:
        share = self._own_share(req.epoch)
        try:
            rd = req.report_data()
            enc = TRANSPORT_SUITE.encrypt(
                bytes(share), X25519PublicKey.from_public_bytes(req.enclave_public_key),
                info=share_info(req.epoch, self.index, rd))
        finally:
            share[:] = bytes(len(share))
        return self._signed_release(req.epoch, rd, enc)

    def _own_share(self, epoch: int) -> bytearray:
        """This shard's share of ``epoch``, unsealed (the caller wipes it). A share that does
        not open is this shard's failure (ShareUnavailableError), never the requester's."""
        try:
            return read_sealed(share_path(self.cfg.data_dir, epoch), self.cfg.seal_key,
                               share_label(epoch, self.index))
        except SealError as e:
            raise ShareUnavailableError(
                f"shard {self.index} cannot open its share of epoch {epoch}: "
                f"{e.message}") from e

    def _signed_release(self, epoch: int, rd: bytes, encrypted: bytes) -> Release:
        """The release answer for ``rd``, carrying ``encrypted`` (a share or a partial
        decryption, encrypted to the enclave), signed with this shard's identity."""
        unsigned = Release(epoch=epoch, shard_index=self.index, shard_address=self.address,
                           report_data=rd, encrypted_share=encrypted,
                           issued_at=int(self.cfg.now()), signature=b"")
        sig = sign_eip191(self.cfg.identity, release_digest(unsigned.unsigned_json()))
        return replace(unsigned, signature=sig)

    def _log(self, req: ReleaseRequest | None, quote: VerifiedQuote | None,
             decision: Decision) -> None:
        self.cfg.release_log.append({
            "time": int(self.cfg.now()), "shard_index": self.index,
            "decision": "released" if decision.released else "refused",
            "reason": decision.reason,
            "epoch": req.epoch if req else None,
            "purpose": req.purpose if req else None,
            "challenge_id": req.challenge_id if req else None,
            "requester": req.requester if req else None,
            "enclave_key_sha256": (hashlib.sha256(req.enclave_public_key).hexdigest()
                                   if req else None),
            "measurement": quote.measurement.hex() if quote else None,
            # per-receipt decryptions are logged by receipt, not just by epoch
            "receipt_hash": (req.target.receipt_hash.hex()
                             if req and req.target else None),
            "ciphertext_hash": (req.target.ciphertext_hash.hex()
                                if req and req.target else None),
        })
