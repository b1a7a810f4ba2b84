"""Receipts and DA evidence made as an operator makes them, honestly or (``unsafe_``)
dishonestly: a test double standing in for an operator in tests, the devnet checks and the
challenge benchmark. The cheating variants exist only to prove that each cheat is slashed.

Every receipt goes through the operator's own issuer (``operator.evidence.ReceiptIssuer``,
the code ``EvidencePipeline.seal_and_sign`` runs): a cheat overrides one input — the result it
claims, the request it ran, the blob it publishes — and never re-implements sealing or
signing, so an honest receipt here is byte for byte what the operator would issue.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from verinfer.engine.engine import Engine, GenerationResult
from verinfer.engine.served import prompt_tokenizer, served_model
from verinfer.operator.evidence import ReceiptIssuer
from verinfer.protocol.exec_request import ExecRequest
from verinfer.protocol.request_rule import exec_requests
from verinfer.receipts.canonical import ExecResult
from verinfer.receipts.eip712 import Domain, ReceiptSigner
from verinfer.receipts.envelope import EnvelopeBinding, EnvelopeContents, seal_plaintext
from verinfer.receipts.epoch_keys import EpochPublicKey
from verinfer.receipts.signed import SignedReceipt


@dataclass(frozen=True)
class Evidence:
    """One response's receipt and the ciphertext that must be on DA for it."""

    signed: SignedReceipt
    blob: bytes
    request_body: bytes
    text: str  # what the client read

    @property
    def digest(self) -> bytes:
        return self.signed.digest


def chat_body(content: str, *, max_tokens: int = 8, seed: int | None = None,
              temperature: float | None = None, system: str | None = None) -> bytes:
    msgs: list[dict[str, str]] = []
    if system is not None:
        msgs.append({"role": "system", "content": system})
    msgs.append({"role": "user", "content": content})
    body: dict[str, Any] = {"model": "tiny", "messages": msgs, "max_tokens": max_tokens}
    if seed is not None:
        body["seed"] = seed
    if temperature is not None:
        body["temperature"] = temperature
    return json.dumps(body, separators=(",", ":")).encode()


def request_for_body(engine: Engine, body_bytes: bytes) -> ExecRequest:
    """The ExecRequest an honest server runs for choice 0 of ``body_bytes``: the protocol's
    request rule, as the operator and the verifier apply it (no copy of it here)."""
    return exec_requests(body_bytes, served_model(engine), prompt_tokenizer(engine))[0]


class EvidenceFactory:
    """Acts as one operator: signs receipts with its key and seals to the epoch key."""

    def __init__(self, engine: Engine, signer: ReceiptSigner, domain: Domain, *,
                 key_epoch: int, epoch_public_key: EpochPublicKey,
                 now: Callable[[], float] = time.time) -> None:
        self.engine, self.signer, self.domain = engine, signer, domain
        self.key_epoch, self.epoch_public_key, self.now = key_epoch, epoch_public_key, now
        self.issuer = ReceiptIssuer(signer, domain, key_epoch, epoch_public_key, clock=now)

    @property
    def operator(self) -> str:
        return self.signer.address

    def _generate(self, request: ExecRequest, engine: Engine | None = None) -> GenerationResult:
        return (engine or self.engine).generate(list(request.prompt_token_ids),
                                                request.sampling_params(),
                                                top_logprobs=request.top_logprobs)

    def _finish(self, body: bytes, request: ExecRequest, result: ExecResult, text: str,
                *, blob: bytes | None = None) -> Evidence:
        """The operator's seal (unless a blob is forced) and signature over what is claimed."""
        if blob is None:
            response = json.dumps({"choices": [{"message": {"content": text}}]}).encode()
            blob = self.issuer.seal(request, result, body, response)
        return Evidence(self.issuer.sign(request, result, blob), blob, body, text)

    # ---- honest ------------------------------------------------------------------------------
    def honest(self, body: bytes) -> Evidence:
        request = request_for_body(self.engine, body)
        gen = self._generate(request)
        return self._finish(body, request, ExecResult.from_generation(gen), gen.text)

    # ---- cheats (each must be slashed) -----------------------------------------------------
    def unsafe_tampered_text(self, body: bytes, replacement: str = "tampered!") -> Evidence:
        """Serves other text than the model produced; the receipt commits to that text."""
        request = request_for_body(self.engine, body)
        gen = self._generate(request)
        res = replace(ExecResult.from_generation(gen),
                      text_sha256=hashlib.sha256(replacement.encode()).digest())
        return self._finish(body, request, res, replacement)

    def unsafe_tampered_tokens(self, body: bytes) -> Evidence:
        """Claims other output tokens (last one changed)."""
        request = request_for_body(self.engine, body)
        gen = self._generate(request)
        res = ExecResult.from_generation(gen)
        toks = list(res.output_token_ids)
        toks[-1] = (toks[-1] + 1) % self.engine.config.vocab_size
        res = replace(res, output_token_ids=tuple(toks))
        return self._finish(body, request, res, gen.text)

    def unsafe_dropped_v3_options(self, body: bytes) -> Evidence:
        """Seals the rule's request (penalties, logit_bias, a grammar: vi-sample-v3) but serves
        an answer drawn without them (e.g. JSON that violates the request's schema)."""
        request = request_for_body(self.engine, body)
        plain = replace(request.sampling_params(), presence_penalty=0.0,
                        frequency_penalty=0.0, logit_bias=(), grammar=None)
        gen = self.engine.generate(list(request.prompt_token_ids), plain,
                                   top_logprobs=request.top_logprobs)
        return self._finish(body, request, ExecResult.from_generation(gen), gen.text)

    def unsafe_other_model(self, body: bytes, other: Engine) -> Evidence:
        """Runs ``other`` (other weights) but claims this engine's model id."""
        request = request_for_body(self.engine, body)
        gen = self._generate(request, other)
        return self._finish(body, request, ExecResult.from_generation(gen), gen.text)

    def unsafe_injected_system_prompt(self, body: bytes, system: str) -> Evidence:
        """Prepends a system prompt the client never sent, and runs that."""
        b = json.loads(body)
        b["messages"] = [{"role": "system", "content": system}, *b["messages"]]
        injected = json.dumps(b, separators=(",", ":")).encode()
        request = request_for_body(self.engine, injected)
        seed = request_for_body(self.engine, body).seed
        request = replace(request, seed=seed)  # keep the client's seed: only the prompt differs
        gen = self._generate(request)
        return self._finish(body, request, ExecResult.from_generation(gen), gen.text)

    def unsafe_wrong_seed(self, body: bytes, seed: int) -> Evidence:
        """Samples with another seed than the client asked for (and says so in ExecRequest)."""
        request = replace(request_for_body(self.engine, body), seed=seed)
        gen = self._generate(request)
        return self._finish(body, request, ExecResult.from_generation(gen), gen.text)

    def unsafe_hidden_wrong_seed(self, body: bytes, seed: int) -> Evidence:
        """Samples with another seed but claims the client's seed in ExecRequest."""
        request = request_for_body(self.engine, body)
        gen = self._generate(replace(request, seed=seed))
        return self._finish(body, request, ExecResult.from_generation(gen), gen.text)

    def unsafe_stale_output(self, body: bytes, old: Evidence, old_text_result: ExecResult
                            ) -> Evidence:
        """Answers a new request with an old response (a cached result replayed): a new
        receipt for the new request carrying the old ExecResult."""
        request = request_for_body(self.engine, body)
        return self._finish(body, request, old_text_result, old.text)

    def unsafe_undecryptable(self, body: bytes) -> Evidence:
        """Publishes bytes that are no envelope at all (the receipt commits to them)."""
        request = request_for_body(self.engine, body)
        gen = self._generate(request)
        junk = b"VIE\x01\x01" + self.key_epoch.to_bytes(8, "big") + hashlib.sha256(body).digest()
        return self._finish(body, request, ExecResult.from_generation(gen), gen.text, blob=junk)

    def unsafe_envelope_of_other_response(self, body: bytes, other: Evidence) -> Evidence:
        """A correctly sealed envelope, but of another response (does not match the hashes)."""
        request = request_for_body(self.engine, body)
        gen = self._generate(request)
        return self._finish(body, request, ExecResult.from_generation(gen), gen.text,
                            blob=other.blob)

    def unsafe_mismatched_contents(self, body: bytes) -> Evidence:
        """Seals, under this receipt's binding, an ExecResult other than the one the receipt
        commits to (only a dishonest sealer can: ``seal`` refuses it, ``seal_plaintext``
        does not check). It opens, but does not hash to outHash."""
        request = request_for_body(self.engine, body)
        gen = self._generate(request)
        claimed = ExecResult.from_generation(gen)
        other = replace(claimed, text_sha256=hashlib.sha256(b"other").digest())
        binding = EnvelopeBinding.for_execution(
            operator=self.operator, chain_id=self.domain.chain_id, key_epoch=self.key_epoch,
            request=request, result=claimed)
        plaintext = EnvelopeContents(request, other, body, b"{}").to_bytes()
        blob = seal_plaintext(plaintext, binding, self.epoch_public_key)
        return self._finish(body, request, claimed, gen.text, blob=blob)
