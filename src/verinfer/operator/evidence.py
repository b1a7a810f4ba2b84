"""The publish pipeline of one response: ExecRequest/ExecResult → envelope → receipt →
signature → durable outbox entry, and the ``verification`` object the client receives.

Only the outbox write (one fsync, group-committed across concurrent requests) sits on the
response's critical path; the DA upload, batching and the on-chain commit happen later in the
publisher thread. The envelope holds the response body *before* the verification object is
attached (the receipt names the ciphertext's hash, so the ciphertext cannot contain the
receipt). For a stream, that body is the exact SSE bytes sent before the final chunk.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from verinfer.da_client.base import DEFAULT_MAX_BLOB_BYTES
from verinfer.da_client.outbox import Outbox
from verinfer.da_client.pointer import Pointer
from verinfer.engine.engine import Engine, GenerationResult
from verinfer.errors import ClientError
from verinfer.protocol.exec_request import ExecRequest
from verinfer.protocol.hexutil import to_hex
from verinfer.receipts.canonical import ExecResult
from verinfer.receipts.eip712 import Domain, Receipt, ReceiptSigner
from verinfer.receipts.envelope import EnvelopeBinding, EnvelopeContents, ciphertext_hash, seal
from verinfer.receipts.epoch_keys import EpochPublicKey
from verinfer.receipts.signed import SignedReceipt

VERIFICATION_VERSION = 1
#: The most evidence (ciphertext) one response may make, all its choices together. Each choice's
#: blob seals the request body and the whole response, so a response's evidence grows with
#: choices x (body + response): 128 choices of a 4 MiB body are 512 MiB, built in memory and
#: handed to the stream (or outbox) in one call. The committer's default buffer.
MAX_RESPONSE_EVIDENCE_BYTES = 256 * 1024 * 1024


class EvidenceTooLargeError(ClientError):
    """The answer's DA blob would exceed what a DA backend takes: not signed, not served."""

    code = "evidence_too_large"


def check_evidence_size(choices: int, request_bytes: int, response_bytes: int = 0) -> None:
    """Raises :class:`EvidenceTooLargeError` when a response of ``choices`` choices to a
    ``request_bytes`` body (with a ``response_bytes`` response: 0 before it is generated, so
    a body that alone passes the bound is refused before the engine) would make more than
    MAX_RESPONSE_EVIDENCE_BYTES of evidence."""
    evidence = choices * (request_bytes + response_bytes)
    if evidence > MAX_RESPONSE_EVIDENCE_BYTES:
        raise EvidenceTooLargeError(
            f"the answer's evidence would be over {evidence} bytes ({choices} choices, each "
            f"sealing the {request_bytes}-byte request body and the whole response), more "
            f"than {MAX_RESPONSE_EVIDENCE_BYTES}: ask for fewer choices or prompts, or send "
            "a smaller body")


@dataclass(frozen=True)
class Execution:
    """One choice as the engine ran it: the request rule's ExecRequest (the job's, never
    rebuilt here, so the receipt commits to exactly what the rule planned) and its result."""

    request: ExecRequest
    result: GenerationResult


class ReceiptIssuer:
    """Seals and signs as one operator: the envelope of one choice to the epoch key, then the
    EIP-712 receipt naming its ciphertext. The one home of that rule; the publish pipeline and
    the test doubles (``verinfer.testing.evidence``) both go through it."""

    def __init__(self, signer: ReceiptSigner, domain: Domain, key_epoch: int,
                 epoch_key: EpochPublicKey, *, clock: Callable[[], float] = time.time,
                 before_sign: Callable[[Receipt], None] | None = None,
                 max_blob_bytes: int = DEFAULT_MAX_BLOB_BYTES) -> None:
        """``before_sign`` sees each receipt, issuedAt set, before it is signed, and raises to
        refuse it (the operator's coverage guard: a receipt the chain would find invalid on its
        face must never be signed). ``max_blob_bytes``: the largest blob the DA takes."""
        self.signer, self.domain, self.key_epoch = signer, domain, key_epoch
        self.epoch_key, self.clock, self.before_sign = epoch_key, clock, before_sign
        self.max_blob_bytes = max_blob_bytes

    @property
    def operator(self) -> str:
        return self.signer.address

    def seal(self, request: ExecRequest, result: ExecResult, request_body: bytes,
             response_body: bytes) -> bytes:
        """The DA blob: the exchange sealed to the epoch key, bound to the receipt's fields."""
        binding = EnvelopeBinding.for_execution(operator=self.operator,
                                                chain_id=self.domain.chain_id,
                                                key_epoch=self.key_epoch, request=request,
                                                result=result)
        return seal(EnvelopeContents(request, result, request_body, response_body), binding,
                    self.epoch_key)

    def sign(self, request: ExecRequest, result: ExecResult, blob: bytes) -> SignedReceipt:
        """The signed receipt committing to ``request``, ``result`` and the blob's hash."""
        receipt = Receipt.create(
            operator=self.operator, chain_id=self.domain.chain_id, model_id=request.model_id,
            engine_fingerprint_hash=request.engine_fingerprint_hash, req_hash=request.hash,
            out_hash=result.hash, key_epoch=self.key_epoch,
            ciphertext_hash=ciphertext_hash(blob), now=self.clock)
        if self.before_sign is not None:
            self.before_sign(receipt)
        return SignedReceipt.sign(receipt, self.domain, self.signer)

    def issue(self, request: ExecRequest, result: ExecResult, request_body: bytes,
              response_body: bytes) -> tuple[SignedReceipt, bytes]:
        """Seal, then sign: (signed receipt, DA blob). A blob larger than a DA backend takes
        is refused before any signature (:class:`EvidenceTooLargeError`): its receipt could
        never be published, and a claim on it would slash the operator."""
        blob = self.seal(request, result, request_body, response_body)
        if len(blob) > self.max_blob_bytes:
            raise EvidenceTooLargeError(
                f"the answer's evidence is {len(blob)} bytes, more than the {self.max_blob_bytes} "
                "a DA blob may hold (the request body and the whole response, every choice "
                "with its logprobs, are sealed for each choice): ask for fewer choices, tokens "
                "or top_logprobs, or send a smaller body")
        return self.sign(request, result, blob), blob


class EvidencePipeline:
    def __init__(self, engine: Engine, signer: ReceiptSigner, domain: Domain, key_epoch: int,
                 epoch_key: EpochPublicKey, outbox: Outbox, da_backend: str, *,
                 clock: Callable[[], float] = time.time,
                 before_sign: Callable[[Receipt], None] | None = None,
                 record: Callable[[Sequence[tuple[bytes, bytes, bytes]], bytes | None], None]
                 | None = None) -> None:
        """``record``: where a response's (digest, receipt, ciphertext) entries go before the
        response leaves, instead of the outbox (stream mode, issue 37:
        :class:`verinfer.operator.stream.StreamRecorder`); it raises to refuse them."""
        if da_backend == "eigenda":
            # The receipt would name a pointer only known after upload; publish through a
            # content-addressed backend and let the publisher fail over (see docs/operator.md).
            raise ValueError("the operator's primary DA backend must be content-addressed "
                             "(local or redis)")
        self.engine, self.signer, self.domain = engine, signer, domain
        self.key_epoch, self.epoch_key, self.outbox = key_epoch, epoch_key, outbox
        self.da_backend, self.clock = da_backend, clock
        self.record = record
        self.issuer = ReceiptIssuer(signer, domain, key_epoch, epoch_key, clock=clock,
                                    before_sign=before_sign)

    @property
    def operator(self) -> str:
        return self.signer.address

    def seal_and_sign(self, ex: Execution, request_body: bytes, response_body: bytes
                      ) -> tuple[SignedReceipt, bytes, ExecRequest, ExecResult]:
        res = ExecResult.from_generation(ex.result)
        signed, blob = self.issuer.issue(ex.request, res, request_body, response_body)
        return signed, blob, ex.request, res

    def publish(self, executions: Sequence[Execution], request_body: bytes,
                response_body: bytes, *, owner: bytes | None = None) -> dict[str, Any]:
        """Seals, signs and durably enqueues every choice (one transaction); returns the
        ``verification`` object. Blocking: call it off the event loop. ``owner``: sha256 of
        the paying API key (only it may read the receipts back). A response whose evidence
        would pass MAX_RESPONSE_EVIDENCE_BYTES is refused before anything is sealed."""
        check_evidence_size(len(executions), len(request_body), len(response_body))
        made = [self.seal_and_sign(ex, request_body, response_body) for ex in executions]
        items = [(signed.digest, signed.to_bytes(), blob) for signed, blob, _, _ in made]
        if self.record is not None:
            self.record(items, owner)
        else:
            self.outbox.enqueue_many(items, owner=owner)
        entries = [self._entry(ex, signed, blob, req, res)
                   for ex, (signed, blob, req, res) in zip(executions, made, strict=True)]
        out = dict(entries[0])
        if len(entries) > 1:
            out["choices"] = entries
        return out

    def _entry(self, ex: Execution, signed: SignedReceipt, blob: bytes, req: ExecRequest,
               res: ExecResult) -> dict[str, Any]:
        return {
            "version": VERIFICATION_VERSION,
            "receipt_id": to_hex(signed.digest),
            "receipt": signed.receipt.as_typed_data(signed.domain),
            "signature": to_hex(signed.signature),
            "operator": self.operator,
            "req_hash": to_hex(req.hash),
            "out_hash": to_hex(res.hash),
            "seed": req.seed,
            "da_pointer": str(Pointer.for_blob(self.da_backend, blob)),
            "key_epoch": self.key_epoch,
            "exec_request": req.to_json(),
            "exec_result": res.to_json(),
        }
