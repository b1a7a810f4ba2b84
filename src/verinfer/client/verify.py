"""Every check a verified client runs on an answer before the app sees it.

:meth:`Verifier.verify` takes the body bytes this client sent, the response's ``verification``
object and what the client received per choice (text — a stream's deltas reassembled —,
finish reason, output token ids when the response lists them), and returns the checked
receipts or raises :class:`~verinfer.client.errors.VerificationError` naming the first check
that failed. The checks, in order (docs/client.md says what each protects against):

``format``       the verification object parses (typed data, signature, ExecRequest/Result)
``chain_id``     the receipt and its EIP-712 domain name the configured chain
``contract``     the domain's verifyingContract is the configured ChallengeManager
``signature``    the signature recovers to the receipt's operator (low-s, v 27/28)
``operator``     that operator is an active staked operator on chain (and, if the policy
                 lists operators, one of them)
``issued_at``    issuedAt within ``max_skew_s`` ahead of and ``max_age_s`` behind the clock
``model``        the receipt's model is one the client accepts (the body's name bound to it)
                 and approved on chain at issuedAt
``fingerprint``  the ExecRequest's engine fingerprint hashes to the receipt's, is approved at
                 issuedAt (and in the policy's list, if any)
``coverage``     declared verifiers cover the (fingerprint, model) pool at issuedAt
``key_epoch``    the receipt's KMS key epoch was live at issuedAt
``request``      reqHash = the hash of the ExecRequest the protocol's request rule
                 (verinfer.protocol.request_rule, imported, not copied) gives for the bytes
                 this client sent, for this choice
``output``       outHash = the hash of the ExecResult whose text hash is sha256 of the output
                 text received (``choices[i].verinfer.output_text`` when the response gives it,
                 as it does for a tool-call answer; else the content), with the finish reason
                 (``tool_calls`` exactly when the answer has calls, else the signed ``stop`` /
                 ``length``: the server's mapping) and token ids received
``tool_calls``   chat: the message's ``tool_calls`` (ids, names, arguments, order, count) are
                 what the protocol's reading (verinfer.protocol.tools.choice_message, imported,
                 not copied) derives from that verified text, the body's tools and reqHash
``content``      chat: the message's content is what the same reading derives (the text before
                 the calls, or the whole text); null and empty are the same content
``choices``      one receipt per choice received
``chain``        a chain read failed: nothing can be decided, so the answer is refused
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from verinfer.chain.structs import Kind
from verinfer.client.chain_view import ChainReadError, ChainView
from verinfer.client.errors import VerificationError
from verinfer.client.models import ClientModel
from verinfer.errors import VerinferError
from verinfer.protocol.exec_request import ExecRequest
from verinfer.protocol.fields import parse_hex
from verinfer.protocol.hexutil import to_hex
from verinfer.protocol.request_rule import MODEL_ID, Endpoint, RequestPlan, load_body, plan_request
from verinfer.protocol.tools import choice_message
from verinfer.receipts.canonical import ExecResult
from verinfer.receipts.eip712 import MAX_ISSUED_AT_SKEW_S, Domain, Receipt, recover_signer
from verinfer.receipts.errors import SignatureError


@dataclass(frozen=True)
class ReceivedCall:
    """One ``message.tool_calls`` entry as received (a stream: its deltas joined per index)."""

    id: str | None
    type: str | None
    name: str | None
    arguments: str | None


@dataclass(frozen=True)
class Received:
    """What the client received for one choice: ``text`` is the message content (a stream:
    its deltas joined; None: null), ``output_text`` the choice's ``verinfer.output_text`` (the
    text the receipt's text hash covers when the message is not the whole output), and
    ``tool_calls`` the message's calls (None or empty: none). ``function_call`` and
    ``refusal``: what the message carried in those fields (an honest answer: None)."""

    text: str | None
    finish_reason: str | None
    output_token_ids: tuple[int, ...] | None = None
    output_text: str | None = None
    tool_calls: tuple[ReceivedCall, ...] | None = None
    function_call: object = None
    refusal: object = None


@dataclass(frozen=True)
class Checked:
    """One verified choice: its receipt, signature and id (what a keeper or a challenge
    needs)."""

    receipt: Receipt
    domain: Domain
    signature: bytes
    receipt_id: str | None
    exec_request: ExecRequest
    exec_result: ExecResult


class Verifier:
    def __init__(self, chain: ChainView, models: Mapping[bytes, ClientModel], *,
                 max_skew_s: int = MAX_ISSUED_AT_SKEW_S, max_age_s: int = MAX_ISSUED_AT_SKEW_S,
                 operators: Sequence[str] | None = None,
                 fingerprints: Sequence[bytes] | None = None,
                 require_coverage: bool = True, require_key_epoch: bool = True,
                 now: Callable[[], float] = time.time) -> None:
        self.chain, self.models = chain, dict(models)
        self.chain_id = chain.deployment.chain_id
        self.contract = Domain(self.chain_id, chain.deployment.challenge_manager
                               ).verifying_contract
        self.max_skew_s, self.max_age_s, self.now = max_skew_s, max_age_s, now
        self.operators = (None if operators is None
                          else frozenset(Domain(1, a).verifying_contract for a in operators))
        self.fingerprints = None if fingerprints is None else frozenset(fingerprints)
        self.require_coverage, self.require_key_epoch = require_coverage, require_key_epoch
        self._names = {n: m.model_id for m in self.models.values() for n in m.names}

    # ---- the whole response ----------------------------------------------------------------
    def verify(self, endpoint: Endpoint, body: bytes, verification: object,
               received: Sequence[Received]) -> list[Checked]:
        if not isinstance(verification, Mapping):
            raise VerificationError("format", "the response carries no verification object")
        listed = verification.get("choices")
        entries: list[Any] = listed if isinstance(listed, list) else [verification]
        if len(entries) != len(received) or not received:
            raise VerificationError("choices", f"{len(received)} choices received, "
                                    f"{len(entries)} verified")
        try:
            self.chain.check_chain_id()
        except ChainReadError as e:
            raise VerificationError("chain", e.message) from e
        honest: dict[tuple[bytes, str], RequestPlan] = {}
        return [self._choice(k, e, endpoint, body, r, honest)
                for k, (e, r) in enumerate(zip(entries, received, strict=True))]

    # ---- one choice --------------------------------------------------------------------------
    def _choice(self, k: int, v: object, endpoint: Endpoint, body: bytes, got: Received,
                honest: dict[tuple[bytes, str], RequestPlan]) -> Checked:
        rid = v.get("receipt_id") if isinstance(v, Mapping) else None
        rid = rid if isinstance(rid, str) else None

        def fail(check: str, message: str) -> VerificationError:
            return VerificationError(check, message, choice=k, receipt_id=rid)

        # format
        try:
            assert isinstance(v, Mapping)
            typed = v["receipt"]
            domain = Domain.from_json(typed["domain"])
            receipt = Receipt.from_json(typed["message"])
            signature = parse_hex(v["signature"], 65, "signature")
            req = ExecRequest.from_json(v["exec_request"])
            res = ExecResult.from_json(v["exec_result"])
        except (AssertionError, KeyError, TypeError) as e:
            raise fail("format", f"the verification object lacks {e}") from None
        except VerinferError as e:
            raise fail("format", e.message) from None
        # chain_id, contract
        if domain.chain_id != self.chain_id or receipt.chain_id != self.chain_id:
            raise fail("chain_id", f"receipt chainId {receipt.chain_id}, domain chainId "
                       f"{domain.chain_id}; this client's chain is {self.chain_id}")
        if domain.verifying_contract != self.contract:
            raise fail("contract", f"signed for contract {domain.verifying_contract}, not "
                       f"the ChallengeManager {self.contract}")
        # signature
        try:
            signer = recover_signer(receipt, domain, signature)
        except SignatureError as e:
            raise fail("signature", e.message) from None
        if signer != receipt.operator:
            raise fail("signature", f"the signature recovers {signer}, not the receipt's "
                       f"operator {receipt.operator}")
        try:
            # operator
            if self.operators is not None and receipt.operator not in self.operators:
                raise fail("operator", f"{receipt.operator} is not an operator this client "
                           "accepts")
            if not self.chain.is_active_operator(receipt.operator):
                raise fail("operator", f"{receipt.operator} is not an active staked operator "
                           f"on chain {self.chain_id}")
            # issued_at
            t = self.now()
            if not t - self.max_age_s <= receipt.issued_at <= t + self.max_skew_s:
                raise fail("issued_at", f"issuedAt {receipt.issued_at} is outside "
                           f"[now - {self.max_age_s} s, now + {self.max_skew_s} s] "
                           f"(now {int(t)})")
            at = receipt.issued_at
            # model
            model = self.models.get(receipt.model_id)
            if model is None:
                raise fail("model", f"model {to_hex(receipt.model_id)} is not one this "
                           "client accepts")
            self._check_model_name(body, model, fail)
            if not self.chain.is_approved_at(Kind.MODEL, receipt.model_id, at):
                raise fail("model", f"model {to_hex(receipt.model_id)} was not approved on "
                           f"chain at issuedAt {at}")
            # fingerprint
            fp = receipt.engine_fingerprint_hash
            if hashlib.sha256(req.engine_fingerprint.encode()).digest() != fp:
                raise fail("fingerprint", "the ExecRequest's engine fingerprint does not hash "
                           "to the receipt's engineFingerprintHash")
            if self.fingerprints is not None and fp not in self.fingerprints:
                raise fail("fingerprint", f"fingerprint {to_hex(fp)} is not one this client "
                           "accepts")
            if not self.chain.is_approved_at(Kind.ENGINE_FINGERPRINT, fp, at):
                raise fail("fingerprint", f"engine fingerprint {to_hex(fp)} was not approved "
                           f"on chain at issuedAt {at}")
            if self.require_coverage and not self.chain.is_covered_at(fp, receipt.model_id, at):
                raise fail("coverage", "no declared verifiers covered this (fingerprint, "
                           f"model) pool at issuedAt {at}: the receipt could not be judged")
            if self.require_key_epoch and not self.chain.is_key_epoch_live_at(
                    receipt.key_epoch, at):
                raise fail("key_epoch", f"key epoch {receipt.key_epoch} was not live at "
                           f"issuedAt {at}")
        except ChainReadError as e:
            raise fail("chain", e.message) from e
        # request
        key = (model.model_id, req.engine_fingerprint)
        if key not in honest:
            try:
                honest[key] = plan_request(body, endpoint,
                                           model.served(req.engine_fingerprint), model.prompts)
            except VerinferError as e:
                raise fail("request", "an honest server refuses the body this client sent "
                           f"({type(e).__name__}: {e.message})") from None
        plan = honest[key].requests
        if k >= len(plan) or plan[k].hash != receipt.req_hash:
            raise fail("request", f"reqHash {to_hex(receipt.req_hash)} is not the hash of "
                       "the ExecRequest the request rule gives for the body this client sent"
                       + (f": {_difference(req, plan[k])}" if k < len(plan) else ""))
        if req.hash != receipt.req_hash:
            raise fail("request", "the exec_request given does not hash to reqHash")
        # output
        if res.hash != receipt.out_hash:
            raise fail("output", "the exec_result given does not hash to outHash")
        # output_text stands for the text only in a chat answer, where the message check below
        # holds the content and calls to it; a completion's text is always the text checked
        text = (got.output_text if endpoint == "chat" and got.output_text is not None
                else (got.text or ""))
        try:
            text_hash = hashlib.sha256(text.encode()).digest()
        except UnicodeEncodeError:
            raise fail("output", "the text received is not valid Unicode") from None
        if res.text_sha256 != text_hash:
            raise fail("output", "the " + ("output_text" if text is got.output_text
                                           else "text") + " received does not hash to the "
                       "receipt's text hash (changed after signing, or not what was signed)")
        finish = res.finish_reason
        if endpoint == "chat":
            finish = self._check_message(honest[key], text, receipt.req_hash, got, res, fail)
        if got.finish_reason is not None and got.finish_reason != finish:
            raise fail("output", f"finish_reason {got.finish_reason!r} received; the signed "
                       f"{res.finish_reason!r} answer is served as {finish!r}")
        if got.output_token_ids is not None and got.output_token_ids != res.output_token_ids:
            raise fail("output", "the output token ids received are not the ones signed")
        return Checked(receipt, domain, signature, rid, req, res)

    @staticmethod
    def _check_message(plan: RequestPlan, text: str, req_hash: bytes, got: Received,
                       res: ExecResult, fail: Callable[[str, str], VerificationError]) -> str:
        """The chat message received is the one the protocol's reading derives from the
        verified output ``text`` (verinfer.protocol.tools.choice_message: content, tool calls
        with their ids); returns the finish reason an honest server writes for it."""
        try:
            content, calls = choice_message(plan.policy.tools, text, req_hash)
        except (VerinferError, TypeError, ValueError, RecursionError) as e:
            raise fail("tool_calls", "an honest server cannot read the signed output text "
                       f"({type(e).__name__}: {e})") from None
        want = [(c["id"], c["type"], c["function"]["name"], c["function"]["arguments"])
                for c in calls or ()]
        have = [(c.id, c.type, c.name, c.arguments) for c in got.tool_calls or ()]
        if got.function_call is not None:
            raise fail("tool_calls", "the message carries a legacy function_call, which an "
                       "honest server never writes")
        if have != want:
            raise fail("tool_calls", _calls_difference(have, want))
        if (got.text or "") != (content or "") or got.refusal is not None:
            raise fail("content", "the message content is not what the signed output text "
                       "reads as" + (" (with tool calls)" if want else "")
                       if got.refusal is None else "the message carries a refusal, which "
                       "an honest server never writes")
        return "tool_calls" if want else res.finish_reason

    def _check_model_name(self, body: bytes, model: ClientModel,
                          fail: Callable[[str, str], VerificationError]) -> None:
        """A body naming a model id is held to it by the rule; a body naming one of a client
        model's names is held to that model here."""
        try:
            name = load_body(body).get("model")
        except VerinferError:
            return  # the request check refuses the body
        if not isinstance(name, str) or MODEL_ID.fullmatch(name):
            return
        want = self._names.get(name)
        if want is not None and want != model.model_id:
            raise fail("model", f"the body asked for {name!r} ({to_hex(want)}); the answer "
                       f"is signed for model {to_hex(model.model_id)}")


def _difference(got: ExecRequest, want: ExecRequest) -> str:
    from dataclasses import fields

    names = [f.name for f in fields(ExecRequest) if getattr(got, f.name) != getattr(want, f.name)]
    return "the signed ExecRequest differs in " + (", ".join(names) or "nothing it shows")


_CALL_FIELDS = ("id", "type", "name", "arguments")


def _calls_difference(have: Sequence[tuple[Any, ...]], want: Sequence[tuple[Any, ...]]) -> str:
    if len(have) != len(want):
        return (f"{len(have)} tool call(s) received; the signed output text reads as "
                f"{len(want)}")
    for k, (h, w) in enumerate(zip(have, want, strict=True)):
        for name, a, b in zip(_CALL_FIELDS, h, w, strict=True):
            if a != b:
                return (f"tool call {k}: {name} {a!r} received; the signed output text reads "
                        f"as {b!r}")
    return "the tool calls differ"  # (not reached: the lists differ somewhere)
