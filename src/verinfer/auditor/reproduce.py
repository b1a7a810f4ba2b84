"""`verinfer reproduce`: one receipt, from its signature to a replay on this machine.

Steps (each a :class:`~verinfer.auditor.report.Step`; docs/cookbook.md walks them by hand):

1. signature — the EIP-712 signature recovers to the receipt's operator; on chain, that
   operator is staked;
2. batch — the receipt is a leaf of a committed batch (Merkle proof against the root the
   chain recorded), or it is still unbatched (said plainly, with its publication deadline);
3. ciphertext — fetched from DA, it hashes to the receipt's ciphertextHash;
4. open — it opens with the auditor's app key, or the auditor's transcript hashes to the
   receipt's reqHash/outHash; the request body parses with the bounded parser;
5. environment — the receipt's backend is the one chosen (``--backend``: else "cannot
   reproduce" before any engine starts), a model file hashing to the model id, the model's
   tokenizer, the engine fingerprint's fields (which differ, and whether it matters), the ISA
   path in use;
6. replay — the ExecRequest is what the request body asks for (the request rule), and one
   forward pass over the claimed tokens (verifier/reexec.py ``recompute``; a full decode only
   when they do not reproduce) gives the receipt's outHash — else the first differing step.

The verdict and exit codes: verinfer/auditor/report.py.
"""

from __future__ import annotations

import logging
import shlex
import time
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from verinfer.auditor.environment import find_model, fingerprint_diffs
from verinfer.auditor.material import AppKey, ClientTranscript, save_transcript
from verinfer.auditor.report import Report, Step, Stop, Verdict, cannot, mismatch
from verinfer.auditor.sources import Resolved, fetch_ciphertext, resolve_ref
from verinfer.chain.bindings import Contracts
from verinfer.chain.structs import ETHER, Kind, Role, publication_deadline
from verinfer.engine.backends import (
    FINGERPRINT_BACKENDS,
    EngineChoice,
    backend_for_fingerprint,
)
from verinfer.engine.engine import Engine
from verinfer.engine.served import prompt_tokenizer, served_model
from verinfer.errors import BadInputError, VerinferError
from verinfer.protocol.exec_request import ExecRequest
from verinfer.protocol.hexutil import to_hex
from verinfer.protocol.jsonsafe import UntrustedJsonError, loads_untrusted
from verinfer.protocol.request_rule import exec_requests
from verinfer.receipts.canonical import ExecResult
from verinfer.receipts.envelope import EnvelopeContents, open_envelope
from verinfer.receipts.errors import EnvelopeContentError, EnvelopeDecryptionError
from verinfer.receipts.merkle import verify_proof
from verinfer.receipts.signed import SignedReceipt
from verinfer.verifier.chain_view import ChainView
from verinfer.verifier.challenger import Located, locate
from verinfer.verifier.conformance import request_problems
from verinfer.verifier.enclave_judge import BlobSource
from verinfer.verifier.reexec import engine_for, recompute, tokenizer_matches, unexecutable

log = logging.getLogger("verinfer.auditor")


@dataclass
class ChainAccess:
    """The chain an auditor reads (optional: without it steps 1b and 2 are skipped)."""

    view: ChainView
    contracts: Contracts
    rpc_url: str
    deployment: Path


@dataclass
class AuditConfig:
    models: list[str] = field(default_factory=list)  # files or shipped model names
    app_key: AppKey | None = None
    transcript: EnvelopeContents | ClientTranscript | None = None
    operator_url: str | None = None
    save_transcript: Path | None = None
    #: how the auditor reaches DA, repeated in the printed `verinfer challenge` command
    da_args: list[str] = field(default_factory=list)
    da_backends: list[str] = field(default_factory=list)
    #: the engine replaying (`--backend`): the receipt's fingerprint names the one it needs
    engine: EngineChoice = field(default_factory=EngineChoice)


@dataclass
class _Audit:
    """What one run has learnt so far."""

    report: Report
    signed: SignedReceipt | None = None
    resolved: Resolved | None = None
    located: Located | None = None
    blob: bytes | None = None
    contents: EnvelopeContents | None = None
    client: tuple[ClientTranscript, ExecResult] | None = None  # before its request is rebuilt
    engine: Engine | None = None
    seconds: dict[str, float] = field(default_factory=dict)


class Auditor:
    def __init__(
        self,
        cfg: AuditConfig,
        *,
        chain: ChainAccess | None = None,
        da: BlobSource | None = None,
        on_step: Callable[[Step], None] = lambda s: None,
        on_start: Callable[[str], None] = lambda name: None,
    ) -> None:
        self.cfg, self.chain, self.da = cfg, chain, da
        self.on_step, self.on_start = on_step, on_start

    def run(self, ref: str) -> Report:
        a = _Audit(Report())
        t0 = time.perf_counter()
        try:
            for name, fn in (
                ("signature", self._signature),
                ("batch", self._batch),
                ("ciphertext", self._ciphertext),
                ("open", self._open),
                ("environment", self._environment),
                ("replay", self._replay),
            ):
                self.on_start(name)
                t = time.perf_counter()
                try:
                    step = fn(a, ref)
                except (VerinferError, OSError) as e:
                    # the auditor's own side failed (an unreachable RPC or DA, an unreadable
                    # file): nothing is said about the operator
                    why = e.message if isinstance(e, VerinferError) else f"{type(e).__name__}: {e}"
                    raise self._fail(a, name, cannot(f"{name}: {why[:300]}")) from None
                except Stop:
                    raise
                except Exception as e:
                    # a fault of the auditor's own code on some input: it proves nothing
                    # about the operator, and a traceback would exit 1, which reads "mismatch"
                    log.exception("reproduce: step %s failed", name)
                    raise self._fail(
                        a,
                        name,
                        cannot(
                            f"{name}: the auditor failed on this input ({type(e).__name__}: "
                            f"{str(e)[:200]}); nothing is said about the operator"
                        ),
                    ) from None
                finally:
                    a.seconds[name] = round(time.perf_counter() - t, 4)
                self._emit(a, step)
        except Stop as s:
            a.report.verdict = s.verdict
        a.report.facts["seconds"] = {**a.seconds, "total": round(time.perf_counter() - t0, 4)}
        if a.report.verdict.outcome == "mismatch" and a.signed is not None:
            a.report.challenge_command = self.challenge_command(a.signed)
        return a.report

    def _emit(self, a: _Audit, step: Step) -> None:
        a.report.steps.append(step)
        self.on_step(step)

    def _fail(self, a: _Audit, name: str, stop: Stop, **data: Any) -> Stop:
        """Records the failing step and returns ``stop`` for the caller to raise."""
        self._emit(a, Step(name, "fail", stop.verdict.text(), data))
        return stop

    def challenge_command(self, signed: SignedReceipt) -> str:
        """The exact `verinfer challenge` that escalates (the challenger's key comes from
        $VERINFER_CHAIN_PRIVATE_KEY or --keystore: never printed)."""
        cmd = ["verinfer", "challenge", to_hex(signed.digest)]
        if self.chain is not None:
            cmd += ["--rpc-url", self.chain.rpc_url, "--deployment", str(self.chain.deployment)]
        else:
            cmd += ["--rpc-url", "RPC_URL", "--deployment", "deployment.json"]
        return shlex.join([*cmd, *self.cfg.da_args])

    # ---- 1. signature -------------------------------------------------------------------------
    def _signature(self, a: _Audit, ref: str) -> Step:
        domain = self.chain.view.domain if self.chain is not None else None
        try:
            by_chain = (
                self.chain is not None
                and self.da is not None
                and (
                    ref.startswith("da://")
                    or (ref.startswith("0x") and len(ref) == 66 and self.cfg.operator_url is None)
                )
            )
            if by_chain:
                assert self.chain is not None and self.da is not None
                a.located = locate(self.chain.view, self.da, ref)
                a.resolved = Resolved(
                    a.located.signed, a.located.ciphertext, "the chain's committed batches"
                )
            else:
                a.resolved = resolve_ref(ref, domain=domain, operator_url=self.cfg.operator_url)
            signed = a.signed = a.resolved.signed
            signer = signed.verify(chain_id=domain.chain_id if domain else None)
        except VerinferError as e:
            raise self._fail(
                a, "signature", cannot(f"no valid receipt: {e.message[:300]}")
            ) from None
        a.report.receipt_id = to_hex(signed.digest)
        r = signed.receipt
        data: dict[str, Any] = {
            "operator": r.operator,
            "signer": signer,
            "source": a.resolved.source,
        }
        detail = f"signed by {signer} = the receipt's operator ({a.resolved.source})"
        if self.chain is None:
            return Step("signature", "ok", detail + "; stake not checked (no chain)", data)
        acct = self.chain.contracts.stakes.account_of(r.operator)
        data["stake_wei"] = acct.stake
        if acct.role is not Role.OPERATOR or acct.stake == 0:
            return Step(
                "signature",
                "warn",
                detail + "; NOT a staked operator on this chain: nothing can be slashed",
                data,
            )
        return Step("signature", "ok", f"{detail}; staked {acct.stake / ETHER:g} ETH", data)

    # ---- 2. batch ---------------------------------------------------------------------------
    def _batch(self, a: _Audit, ref: str) -> Step:
        assert a.signed is not None
        if self.chain is None or self.da is None:
            return Step(
                "batch",
                "skip",
                "no chain or DA given (--rpc-url, --deployment, "
                "--da-store): batch inclusion not checked",
            )
        digest = a.signed.digest
        if a.located is None:
            try:
                a.located = locate(self.chain.view, self.da, to_hex(digest))
            except VerinferError:
                a.located = None
        loc = a.located
        if loc is None or loc.batch is None or loc.proof is None:
            p = self.chain.contracts.config.params()
            deadline = publication_deadline(a.signed.receipt.issued_at, p.publication_deadline)
            _, now = self.chain.view.head()
            when = (
                "has passed: `verinfer challenge` claims it withheld and the operator is "
                "slashed unless it answers with a batch"
                if now > deadline
                else f"is in {deadline - now} s"
            )
            return Step(
                "batch",
                "warn",
                f"unbatched: in no committed batch yet; its "
                f"publication deadline ({deadline}, chain time {now}) {when}",
                {"batched": False, "publication_deadline": deadline},
            )
        b = loc.batch
        if (
            not verify_proof(digest, loc.proof, b.root)
            or b.operator.lower() != a.signed.receipt.operator.lower()
        ):
            raise self._fail(
                a,
                "batch",
                mismatch(
                    f"the manifest's inclusion proof does not lead to batch {to_hex(b.batch_id)}'s "
                    "on-chain root (or the batch is another operator's)"
                ),
            )
        return Step(
            "batch",
            "ok",
            f"leaf {loc.proof.index} of {b.leaf_count} in batch "
            f"0x{b.batch_id.hex()[:16]}… (root 0x{b.root.hex()[:16]}…, block "
            f"{b.block_number}); Merkle proof checks against the on-chain root",
            {
                "batched": True,
                "batch_id": to_hex(b.batch_id),
                "root": to_hex(b.root),
                "leaf_index": loc.proof.index,
                "block": b.block_number,
            },
        )

    # ---- 3. ciphertext ----------------------------------------------------------------------
    def _ciphertext(self, a: _Audit, ref: str) -> Step:
        assert a.signed is not None and a.resolved is not None
        r = a.signed.receipt
        if self.da is None:
            if self.cfg.transcript is not None:
                return Step(
                    "ciphertext", "skip", "no DA given: the transcript stands in for the ciphertext"
                )
            raise self._fail(
                a,
                "ciphertext",
                cannot("no DA backend given (--da-store or --da-redis-url) and no transcript"),
            )
        manifest_ptr = a.located.ciphertext if a.located is not None else None
        named = [
            p
            for p in (manifest_ptr, a.resolved.da_pointer, ref if ref.startswith("da://") else None)
            if p
        ]
        got = fetch_ciphertext(self.da, r.ciphertext_hash, named, self.cfg.da_backends)
        if manifest_ptr is not None and manifest_ptr in got.wrong:
            # the committed manifest names other bytes: what a committee votes
            # INVALID_EVIDENCE on (ciphertext_hash_mismatch)
            raise self._fail(
                a,
                "ciphertext",
                mismatch(
                    f"the batch manifest names {manifest_ptr[:80]}, whose bytes do not hash to the "
                    "receipt's ciphertextHash (faulty evidence)"
                ),
                tried=list(got.tried),
            )
        if got.blob is None:
            if self.cfg.transcript is not None:
                return Step(
                    "ciphertext",
                    "warn",
                    "not found on DA ("
                    + "; ".join(got.tried)
                    + "): going on with the transcript alone",
                    {"tried": list(got.tried)},
                )
            raise self._fail(
                a,
                "ciphertext",
                cannot(
                    "the ciphertext is not on the DA layer this auditor reads ("
                    + "; ".join(got.tried)[:400]
                    + ")"
                ),
                tried=list(got.tried),
            )
        a.blob = got.blob
        return Step(
            "ciphertext",
            "ok",
            f"{len(got.blob)} bytes from {got.pointer}; sha256 = "
            f"ciphertextHash 0x{r.ciphertext_hash.hex()[:16]}…",
            {"pointer": got.pointer, "bytes": len(got.blob)},
        )

    # ---- 4. open ----------------------------------------------------------------------------
    def _open(self, a: _Audit, ref: str) -> Step:
        assert a.signed is not None
        r = a.signed.receipt
        key, transcript = self.cfg.app_key, self.cfg.transcript
        if key is not None:
            if a.blob is None:
                raise self._fail(a, "open", cannot("an app key needs the ciphertext"))
            if key.key_epoch is not None and key.key_epoch != r.key_epoch:
                raise self._fail(
                    a,
                    "open",
                    cannot(
                        f"the app key is epoch {key.key_epoch}'s; the receipt was sealed to epoch "
                        f"{r.key_epoch}"
                    ),
                )
            try:
                contents = open_envelope(a.blob, r, key.key)
            except EnvelopeDecryptionError:
                raise self._fail(a, "open", self._undecryptable(r.key_epoch, key)) from None
            except EnvelopeContentError as e:
                raise self._fail(
                    a,
                    "open",
                    mismatch(
                        f"the envelope opens but does not match the receipt ({e.message[:200]}): "
                        "faulty evidence"
                    ),
                ) from None
            source = "opened with the app key"
            if self.cfg.save_transcript is not None:
                save_transcript(self.cfg.save_transcript, contents, to_hex(a.signed.digest))
                source += f"; transcript written to {self.cfg.save_transcript}"
        elif isinstance(transcript, ClientTranscript):
            claimed = [res for res in transcript.results() if res.hash == r.out_hash]
            if not claimed:
                raise self._fail(
                    a,
                    "open",
                    cannot(
                        "no choice of the transcript's response hashes to the receipt's outHash: "
                        "it is not this receipt's answer"
                    ),
                )
            try:
                loads_untrusted(transcript.request_body, what="the transcript's request body")
            except UntrustedJsonError as e:
                raise self._fail(
                    a,
                    "open",
                    cannot(
                        f"the transcript's request body is not acceptable JSON ({e.message[:120]})"
                    ),
                ) from None
            a.client = (transcript, claimed[0])
            return Step(
                "open",
                "ok",
                "the client's transcript: its answer hashes to outHash "
                f"({len(claimed[0].output_token_ids)} output tokens); its request is "
                "rebuilt with the request rule once the model is loaded",
                {
                    "out_hash": to_hex(r.out_hash),
                    "claimed_tokens": list(claimed[0].output_token_ids),
                },
            )
        elif transcript is not None:
            bad = [
                n
                for n, ok in (
                    ("reqHash", transcript.request.hash == r.req_hash),
                    ("outHash", transcript.result.hash == r.out_hash),
                )
                if not ok
            ]
            if bad:
                raise self._fail(
                    a,
                    "open",
                    cannot(
                        f"the transcript does not hash to the receipt's {' and '.join(bad)}: it is "
                        "not this receipt's exchange"
                    ),
                )
            if (
                transcript.request.model_id != r.model_id
                or transcript.request.engine_fingerprint_hash != r.engine_fingerprint_hash
            ):
                raise self._fail(
                    a,
                    "open",
                    cannot(
                        "the transcript names another model or engine fingerprint than the receipt"
                    ),
                )
            contents, source = transcript, "transcript hashes to reqHash and outHash"
        else:
            raise self._fail(
                a,
                "open",
                cannot(
                    "nothing to open the ciphertext with: pass --app-key FILE or --transcript FILE"
                ),
            )
        try:  # the operator's plaintext: a nesting bomb must not crash the auditor
            loads_untrusted(contents.request_body, what="the envelope's request body")
        except UntrustedJsonError as e:
            raise self._fail(
                a,
                "open",
                mismatch(
                    f"the request body is not acceptable JSON ({e.message[:120]}): no honest "
                    "server accepted it"
                ),
            ) from None
        a.contents = contents
        res = contents.result
        return Step(
            "open",
            "ok",
            f"{source}: {len(contents.request.prompt_token_ids)} prompt "
            f"tokens, {len(res.output_token_ids)} output tokens claimed",
            {
                "req_hash": to_hex(r.req_hash),
                "out_hash": to_hex(r.out_hash),
                "claimed_tokens": list(res.output_token_ids),
            },
        )

    def _client_contents(self, a: _Audit, engine: Engine) -> EnvelopeContents:
        """The client transcript's ExecRequest: the request rule over its body with this
        engine's model, tokenizer and fingerprint; the one of the receipt's reqHash."""
        assert a.client is not None and a.signed is not None
        transcript, result = a.client
        r = a.signed.receipt
        fp = engine.fingerprint
        if fp.hash != r.engine_fingerprint_hash:
            raise self._fail(
                a,
                "environment",
                cannot(
                    f"this engine's fingerprint 0x{fp.hash.hex()[:16]}… is not the receipt's "
                    f"0x{r.engine_fingerprint_hash.hex()[:16]}…, and a client transcript does not "
                    "carry the operator's fingerprint fields to compare (an envelope transcript "
                    "does)"
                ),
            )
        try:
            requests = exec_requests(
                transcript.request_body,
                served_model(engine, fp.canonical().decode()),
                prompt_tokenizer(engine),
            )
        except (VerinferError, ValueError, TypeError, KeyError) as e:
            raise self._fail(
                a,
                "environment",
                cannot(
                    f"the request rule refuses the transcript's request body ({type(e).__name__})"
                ),
            ) from None
        match = [q for q in requests if q.hash == r.req_hash]
        if not match:
            raise self._fail(
                a,
                "environment",
                cannot(
                    "the transcript's request body does not give the receipt's reqHash under the "
                    "request rule: it is not this receipt's request"
                ),
            )
        return EnvelopeContents(match[0], result, transcript.request_body, transcript.response_body)

    def _undecryptable(self, epoch: int, key: AppKey) -> Stop:
        """A wrong key is the auditor's problem; the right key failing is the operator's."""
        if self.chain is None:
            return cannot(
                "the envelope does not open with this app key (a wrong key, or a "
                "faulty ciphertext: with --rpc-url the key is checked against the "
                "epoch's public key on chain)"
            )
        try:
            registered = bytes(
                self.chain.contracts.config.contract.functions.keyEpoch(epoch).call()[0]
            )
        except Exception as e:  # an RPC or decoding fault: cannot tell whose
            return cannot(
                f"the envelope does not open with this app key, and key epoch "
                f"{epoch} could not be read from the chain ({type(e).__name__})"
            )
        if registered != key.key.public.raw:
            return cannot(
                f"the app key is not key epoch {epoch}'s: its public key differs "
                "from the one registered on chain"
            )
        return mismatch(
            f"the envelope does not open under key epoch {epoch}'s key, which "
            "this app key is: faulty evidence"
        )

    # ---- 5. environment ---------------------------------------------------------------------
    def _environment(self, a: _Audit, ref: str) -> Step:
        assert a.signed is not None and (a.contents is not None or a.client is not None)
        model_id = to_hex(a.signed.receipt.model_id)
        path, seen = find_model(a.signed.receipt.model_id, self.cfg.models)
        if path is None:
            raise self._fail(
                a,
                "environment",
                cannot(
                    f"model {model_id} is absent: no model file given hashes to it ("
                    + ("; ".join(seen) or "none given: --model FILE")
                    + ")"
                ),
                model_id=model_id,
            )
        choice = self.cfg.engine
        if a.contents is not None:  # before the engine starts (vLLM's start costs a minute)
            self._same_backend(a, a.contents.request.engine_fingerprint, choice)
        try:
            engine = a.engine = engine_for(path, choice)
        except (VerinferError, ImportError) as e:
            # e.g. VERINFER_KERNEL_ISA names a path this CPU lacks, vLLM is not installed
            why = getattr(e, "message", None) or str(e)
            raise self._fail(
                a, "environment", cannot(f"the engine does not start here: {why[:300]}")
            ) from None
        from verinfer.engine import kernels

        data: dict[str, Any] = {
            "model_file": str(path),
            "model_id": model_id,
            "backend": choice.backend,
            "kernel_isa": kernels.isa(),
            "supported_isas": kernels.supported_isas(),
        }
        if a.contents is None:
            a.contents = self._client_contents(a, engine)
        request = a.contents.request
        if not tokenizer_matches(engine, request):
            raise self._fail(
                a,
                "environment",
                mismatch(
                    f"the ExecRequest names tokenizer 0x{request.tokenizer_hash.hex()[:16]}…, not "
                    f"model {model_id[:18]}…'s: faulty evidence"
                ),
                **data,
            )
        diffs = fingerprint_diffs(request.engine_fingerprint, engine.fingerprint.approved())
        data["fingerprint_differences"] = [d.to_json() for d in diffs]
        blocking = [d for d in diffs if d.matters]
        if blocking:
            names = ", ".join(f"{d.field} ({d.receipt!r} vs here {d.local!r})" for d in blocking)
            raise self._fail(
                a,
                "environment",
                cannot(f"this engine differs from the receipt's in what decides the bits: {names}"),
                **data,
            )
        notes = [
            f"model file {path.name} hashes to the model id",
            "tokenizer matches",
            "engine fingerprint "
            + (
                "identical"
                if not diffs
                else "differs only in "
                + ", ".join(d.field for d in diffs)
                + " (does not change bits)"
            ),
            f"kernels on the {data['kernel_isa']} path (the ISA is never part of the "
            "fingerprint: the invariant kernels give the same bits on every path)"
            if choice.backend == "own"
            else f"the {choice.backend} backend",
        ]
        status: Any = "ok"
        if self.chain is not None:
            cfg = self.chain.contracts.config
            unapproved = [
                n
                for n, kind, item in (
                    ("model id", Kind.MODEL, request.model_id),
                    (
                        "engine fingerprint",
                        Kind.ENGINE_FINGERPRINT,
                        request.engine_fingerprint_hash,
                    ),
                )
                if not cfg.is_approved(kind, item)
            ]
            if unapproved:
                status = "warn"
                notes.append(
                    f"NOT approved on chain: {', '.join(unapproved)} (a challenge "
                    "slashes such a receipt at once)"
                )
        return Step("environment", status, "; ".join(notes), data)

    def _same_backend(self, a: _Audit, receipt_fp: str, choice: EngineChoice) -> None:
        """A receipt signed by another backend than the one chosen cannot be replayed here:
        said before that engine starts, naming the --backend that would do."""
        try:
            theirs = loads_untrusted(receipt_fp, what="the receipt's engine fingerprint")
        except UntrustedJsonError:
            return  # the field-by-field comparison reports it
        named = theirs.get("backend") if isinstance(theirs, dict) else None
        ours = FINGERPRINT_BACKENDS[choice.backend]
        if named is None or named == ours:
            return
        needed = backend_for_fingerprint(named)
        hint = (
            f"replay it with --backend {needed}"
            if needed is not None
            else "this build runs no such backend"
        )
        raise self._fail(
            a,
            "environment",
            cannot(
                f"the receipt was signed under the {named!r} backend's fingerprint and this "
                f"auditor runs the {choice.backend} backend ({ours!r}): {hint}"
            ),
            backend=choice.backend,
            receipt_backend=str(named)[:80],
        )

    # ---- 6. replay --------------------------------------------------------------------------
    def _replay(self, a: _Audit, ref: str) -> Step:
        assert a.signed is not None and a.contents is not None and a.engine is not None
        engine, contents = a.engine, a.contents
        request, claimed = contents.request, contents.result
        try:
            problems = request_problems(engine, request, contents.request_body)
        except (ValueError, TypeError, KeyError, AttributeError, BadInputError) as e:
            problems = [f"the request rule cannot read the request body ({type(e).__name__})"]
        if problems:
            raise self._nonconformant(a, "; ".join(problems))
        why = unexecutable(engine, request)
        if why is not None:
            raise self._fail(a, "replay", mismatch(f"{why}: no honest server ran it"))
        try:
            mine, replayed, decoded = recompute(engine, request, claimed)
        except BadInputError as e:  # as in the verifier's job: the evidence's fault
            raise self._fail(
                a,
                "replay",
                mismatch(f"the engine refuses the request ({e.code or type(e).__name__})"),
            ) from None
        a.report.facts.update(
            {
                "output_tokens": len(mine.output_token_ids),
                "replayed_steps": replayed,
                "decoded_tokens": decoded,
            }
        )
        data = {
            "out_hash": to_hex(mine.hash),
            "logit_digest": to_hex(mine.logit_digest),
            "tokens": list(mine.output_token_ids),
            "replayed_steps": replayed,
            "decoded_tokens": decoded,
        }
        if mine.hash == a.signed.receipt.out_hash:
            a.report.verdict = Verdict("reproduced")
            return Step(
                "replay",
                "ok",
                f"one pass over {replayed} claimed steps: same tokens, "
                "same logit digest, same outHash",
                data,
            )
        verdict = _difference(mine, claimed)
        self._emit(a, Step("replay", "fail", verdict.text(), data))
        raise Stop(verdict)

    def _nonconformant(self, a: _Audit, problems: str) -> Stop:
        """The operator ran another ExecRequest than the body asks for: run the one it asks
        for (closest, when n > 1) and say where the answers part."""
        assert a.engine is not None and a.contents is not None
        engine, contents = a.engine, a.contents
        reason = f"the ExecRequest is not what the request body asks for ({problems})"
        try:
            honest = exec_requests(
                contents.request_body,
                served_model(engine, contents.request.engine_fingerprint),
                prompt_tokenizer(engine),
            )
        except (VerinferError, ValueError, TypeError, KeyError):
            honest = ()
        if not honest:
            return self._fail(a, "replay", mismatch(reason))
        names = [f.name for f in fields(ExecRequest)]
        best = min(
            honest, key=lambda h: sum(getattr(h, n) != getattr(contents.request, n) for n in names)
        )
        gen = engine.generate(
            list(best.prompt_token_ids), best.sampling_params(), top_logprobs=best.top_logprobs
        )
        mine = ExecResult.from_generation(gen, version=best.version)
        v = _difference(mine, contents.result)
        v = Verdict("mismatch", f"{reason}; {v.reason}", v.step, v.token, v.claimed_token)
        self._emit(a, Step("replay", "fail", v.text(), {"tokens": list(mine.output_token_ids)}))
        return Stop(v)


def _difference(mine: ExecResult, claimed: ExecResult) -> Verdict:
    """Where this machine's result and the claim part: the first differing token, else which
    committed field differs."""
    a, b = mine.output_token_ids, claimed.output_token_ids
    k = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), None)
    if k is None and len(a) != len(b):
        k = min(len(a), len(b))
    if k is not None:
        here = a[k] if k < len(a) else None
        there = b[k] if k < len(b) else None
        what = (
            f"token {here} here, the receipt's {there}"
            if here is not None and there is not None
            else "the answer ends here"
            if here is None
            else "the receipt's answer ends here"
        )
        return Verdict("mismatch", what, k, here, there)
    if mine.logit_digest != claimed.logit_digest:
        return Verdict("mismatch", "same tokens, different logit digest")
    if mine.text_sha256 != claimed.text_sha256:
        return Verdict(
            "mismatch",
            "same tokens, but the receipt commits to another text "
            "(text_sha256): the served text was not the model's",
        )
    if mine.logprobs != claimed.logprobs:
        return Verdict("mismatch", "same tokens, different logprobs")
    return Verdict("mismatch", "same tokens, different finish reason")
