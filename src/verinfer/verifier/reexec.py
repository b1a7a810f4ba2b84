"""The re-execution job: runs inside the enclave with the epoch key and returns only a vote.

Order of checks (docs/verifier.md §2), each deterministic so that honest members agree:
1. the blob exists and hashes to the receipt's ciphertextHash      else INVALID_EVIDENCE
2. it opens under the receipt's binding with the epoch key          else INVALID_EVIDENCE
3. its ExecRequest/ExecResult hash to reqHash/outHash               else INVALID_EVIDENCE
4. this engine can judge: same model id                             else abstain (CannotJudge)
   and same approved engine fingerprint (image digest, kernels…)   else abstain (CannotJudge)
   and the approved model's tokenizer (the model id fixes it)       else INVALID_EVIDENCE
5. the ExecRequest is what the client's request body asked for     else INVALID_EVIDENCE
   (the body is parsed with the bounded parser: a nesting bomb is faulty evidence)
   and the engine accepts it (context length, vocabulary, params)  else INVALID_EVIDENCE
6. ONE forward pass (Engine.replay) over prompt + claimed tokens; if the claim reproduces,
   the verifier's own ExecResult is built from the replay (no decode) and hashed;
7. only when it does not, a full decode produces the correct ExecResult: vote its hash.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from verinfer.chain.structs import INVALID_EVIDENCE
from verinfer.engine.backends import EngineChoice
from verinfer.engine.divergence import first_divergence
from verinfer.engine.engine import Engine
from verinfer.engine.fingerprint import EngineFingerprint
from verinfer.engine.loader import sha256_file
from verinfer.errors import BadInputError, InvalidRequestError
from verinfer.protocol.exec_request import ExecRequest
from verinfer.protocol.hexutil import parse_hex, to_hex
from verinfer.protocol.jsonsafe import UntrustedJsonError, loads_untrusted
from verinfer.receipts.canonical import ExecResult
from verinfer.receipts.eip712 import Receipt
from verinfer.receipts.envelope import EnvelopeContents, ciphertext_hash, open_envelope
from verinfer.receipts.epoch_keys import EpochPrivateKey
from verinfer.receipts.errors import EnvelopeContentError, EnvelopeDecryptionError
from verinfer.verifier.conformance import request_problems
from verinfer.verifier.cpu_clock import job_cpu_time
from verinfer.verifier.errors import CannotJudgeError
from verinfer.verifier.votes import Verdict


def _invalid(receipt: Receipt, reason: str, detail: str = "") -> Verdict:
    return Verdict(INVALID_EVIDENCE, reason, receipt.out_hash, detail=detail)


def check_engine(engine: Engine, request: ExecRequest) -> None:
    """Raises CannotJudgeError unless ``engine`` runs the request's model: a verifier without
    that model cannot reproduce anything (its own limitation, so it abstains)."""
    if request.model_id != engine.model_id:
        raise CannotJudgeError(f"request model {to_hex(request.model_id)} is not this "
                               f"verifier's model {to_hex(engine.model_id)}", param="model_id")


def check_fingerprint(engine: Any, request: ExecRequest) -> None:
    """Raises CannotJudgeError unless ``engine`` runs under the request's approved engine
    fingerprint (same hash: same image digest, kernels, summation order, sampler, hardware
    class). Another fingerprint may give other bits for honest work, so its vote could slash
    an honest operator; the receipt's fingerprint is approved on chain (else the challenge
    slashed at open, before any committee), so not running it is this verifier's own
    limitation: it abstains. Any backend works: only ``engine.fingerprint.hash`` is read."""
    mine: bytes = engine.fingerprint.hash
    if mine != request.engine_fingerprint_hash:
        raise CannotJudgeError(f"request engine fingerprint "
                               f"{to_hex(request.engine_fingerprint_hash)} is not this "
                               f"verifier's {to_hex(mine)}", param="engine_fingerprint")


def tokenizer_matches(engine: Engine, request: ExecRequest) -> bool:
    """The tokenizer is part of the approved model identity: the model id (sha256 of the GGUF
    file, which embeds the tokenizer; for safetensors the approved tokenizer.json shipped with
    it) fixes one tokenizer. A request under the same model id naming another tokenizer hash is
    the operator's invention, so it is faulty evidence — abstaining here would let any operator
    stop every verifier by writing a random tokenizer hash."""
    return request.tokenizer_hash == engine.tokenizer.hash


def unexecutable(engine: Engine, request: ExecRequest) -> str | None:
    """Why an honest engine refuses ``request`` (None: it runs it). An operator cannot have
    served an answer to a request its own engine refuses (e.g. max_tokens beyond the context),
    so such evidence is faulty; the verifier's refusal must not escape the job as an error."""
    try:
        engine.check_request(list(request.prompt_token_ids), request.sampling_params())
    except BadInputError as e:
        return f"the engine refuses the request ({e.code or type(e).__name__}, {e.param})"
    except (ValueError, TypeError) as e:  # parameters the engine cannot even represent
        return f"the engine refuses the request ({type(e).__name__})"
    return None


def recompute(engine: Engine, request: ExecRequest, claimed: ExecResult
              ) -> tuple[ExecResult, int, int]:
    """The verifier's own ExecResult for ``request``: from one replay pass when the claimed
    tokens reproduce, else from a full decode. Returns (result, replayed, decoded tokens)."""
    params = request.sampling_params()
    prompt = list(request.prompt_token_ids)
    claim = list(claimed.output_token_ids)
    replayed = 0
    top = request.top_logprobs  # logprobs are committed too: recomputed from the same logits
    if claim and len(claim) <= params.max_tokens:
        try:
            rr = engine.replay(prompt, claim, params, top_logprobs=top)
        except InvalidRequestError:
            rr = None  # e.g. longer than the context: decode settles it
        if rr is not None:
            replayed = len(rr.step_digests)
            if rr.matches and rr.finish_reason is not None:
                _, text = engine.output_state(claim, params)
                lps = (None if rr.logprobs is None
                       else tuple((lp.logprob, lp.top) for lp in rr.logprobs))
                mine = ExecResult(output_token_ids=tuple(claim), finish_reason=rr.finish_reason,
                                  logit_digest=rr.logit_digest,
                                  text_sha256=hashlib.sha256(text.encode()).digest(),
                                  logprobs=lps, version=request.version)
                if mine.hash == claimed.hash:
                    return mine, replayed, 0
    gen = engine.generate(prompt, params, top_logprobs=top)
    return (ExecResult.from_generation(gen, version=request.version), replayed,
            len(gen.token_ids))


class JobClock:
    """Where a job's time goes (benchmarks): process CPU, this thread's CPU, the job's CPU
    (process CPU less the other Python threads', cpu_clock.py) and wall time
    of decryption (hash check + HPKE open) and of re-execution (conformance + replay, and the
    decode when the claim does not reproduce). Clocks are injectable."""

    def __init__(self, cpu: Callable[[], float] = time.process_time,
                 thread_cpu: Callable[[], float] = time.thread_time,
                 wall: Callable[[], float] = time.perf_counter,
                 job_cpu: Callable[[], float] = job_cpu_time) -> None:
        self.clocks = {"cpu": cpu, "thread_cpu": thread_cpu, "wall": wall, "job_cpu": job_cpu}
        self.seconds: dict[str, float] = {}
        self._mark = self._now()

    def _now(self) -> dict[str, float]:
        return {k: c() for k, c in self.clocks.items()}

    def lap(self, phase: str) -> None:
        now = self._now()
        for k, v in now.items():
            key = f"{phase}_{k}_s"
            self.seconds[key] = self.seconds.get(key, 0.0) + v - self._mark[k]
        self._mark = now


#: Opens one receipt's envelope without an epoch key (per-receipt threshold decryption,
#: ``EnclaveRunner.open_receipt``); raises like ``open_envelope``.
EnvelopeOpener = Callable[[bytes, Receipt], EnvelopeContents]
#: The engine of a model id (32 bytes), loaded on first use; CannotJudgeError when this
#: verifier holds no such model (:class:`ModelSet`).
EngineResolver = Callable[[bytes], Engine]


def judge(engine: Engine | EngineResolver, receipt: Receipt, blob: bytes | None,
          private_key: EpochPrivateKey | EnvelopeOpener,
          clock: JobClock | None = None) -> Verdict:
    """Steps 1-7 above. ``blob`` None means DA answered that it does not exist.
    ``engine``: one engine, or a resolver picking one by the decrypted request's model id.
    ``private_key``: the epoch key (legacy suites) or an opener of this one envelope."""
    clock = clock or JobClock()
    try:
        return _judge(engine, receipt, blob, private_key, clock)
    finally:
        clock.lap("reexec")


def _judge(engines: Engine | EngineResolver, receipt: Receipt, blob: bytes | None,
           private_key: EpochPrivateKey | EnvelopeOpener, clock: JobClock) -> Verdict:
    if blob is None:
        return _invalid(receipt, "ciphertext_unavailable")
    if ciphertext_hash(blob) != receipt.ciphertext_hash:
        return _invalid(receipt, "ciphertext_hash_mismatch")
    try:
        contents = (open_envelope(blob, receipt, private_key)
                    if isinstance(private_key, EpochPrivateKey) else private_key(blob, receipt))
    except EnvelopeDecryptionError:
        return _invalid(receipt, "ciphertext_undecryptable")
    except EnvelopeContentError as e:
        return _invalid(receipt, "evidence_mismatch", _field_names(e.message))
    clock.lap("decrypt")  # from here on: the re-execution itself
    request = contents.request
    # The engine is chosen only after the envelope opened (and its binding to the receipt's
    # model id held): an inconsistent envelope is a vote whatever models this verifier holds.
    engine = engines if isinstance(engines, Engine) else engines(request.model_id)
    check_engine(engine, request)
    check_fingerprint(engine, request)
    if not tokenizer_matches(engine, request):
        return _invalid(receipt, "tokenizer_mismatch",
                        f"tokenizer {to_hex(request.tokenizer_hash)} is not model "
                        f"{to_hex(engine.model_id)}'s")
    # The request body is the operator's plaintext: bounded parse first, so a nesting bomb is
    # faulty evidence rather than a crashed enclave (every member would die the same way).
    try:
        loads_untrusted(contents.request_body, what="envelope request body")
    except UntrustedJsonError as e:
        return _invalid(receipt, "request_nonconformant",
                        f"request body is not acceptable JSON ({e.message[:120]})")
    try:
        problems = request_problems(engine, request, contents.request_body)
    except (ValueError, TypeError, KeyError, AttributeError, BadInputError) as e:
        # a body shape the rule cannot even read: no honest server accepted and ran it
        problems = [f"request body cannot be read by the request rule ({type(e).__name__})"]
    if problems:
        return _invalid(receipt, "request_nonconformant", "; ".join(problems))
    why = unexecutable(engine, request)
    if why is not None:
        return _invalid(receipt, "request_unexecutable", why)
    try:
        mine, replayed, decoded = recompute(engine, request, contents.result)
    except BadInputError as e:  # the engine refused it after all: the operator's request
        return _invalid(receipt, "request_unexecutable",
                        f"the engine refuses the request ({e.code or type(e).__name__})")
    reason = "match" if mine.hash == receipt.out_hash else "output_mismatch"
    detail = ""
    if reason == "output_mismatch":
        detail = _diff(mine, contents.result)
    return Verdict(mine.hash, reason, receipt.out_hash, replayed, decoded, detail)


def _field_names(message: str) -> str:
    """Keeps only which hashes differ (the message holds hashes, no plaintext)."""
    names = [n for n in ("req_hash", "out_hash", "model_id", "engine fingerprint", "malformed")
             if n in message]
    return ", ".join(names) or "contents"


def _diff(mine: ExecResult, claimed: ExecResult) -> str:
    a, b = mine.output_token_ids, claimed.output_token_ids
    first = first_divergence(a, b)
    if first is not None:
        return f"tokens differ from step {first}"
    if mine.logit_digest != claimed.logit_digest:
        return "same tokens, different logit digest"
    if mine.logprobs != claimed.logprobs:
        return "same tokens, different logprobs"
    return "finish reason or text hash differs"


# ---- the enclave job -----------------------------------------------------------------------
_ENGINES: dict[tuple[str, EngineChoice], Engine] = {}
_ENGINES_LOCK = threading.Lock()


def engine_for(model_path: str | Path, kernels: str | EngineChoice = "invariant") -> Engine:
    """One engine per (model file, backend and kernels) per process: a long-lived enclave
    worker loads its model once. ``kernels``: an :class:`EngineChoice`, or the one-string form
    (``invariant``, ``fast``: the own engine; ``vllm``: the vLLM backend, imported only then)."""
    choice = EngineChoice.of(kernels)
    key = (str(Path(model_path).resolve()), choice)
    with _ENGINES_LOCK:
        eng = _ENGINES.get(key)
        if eng is None:
            eng = choice.load(model_path)
            _ENGINES[key] = eng
        return eng


def model_file_id(path: str | Path) -> bytes:
    """The model id (sha256 of the weight file) of ``path`` without loading the model:
    hashing ~250 MB costs well under a second, loading costs seconds and memory."""
    p = Path(path)
    if p.is_dir():  # the loader picks the one weight file of a directory; let it
        return Engine.from_path(p).model_id
    return sha256_file(p)


class ModelSet:
    """The models one verifier judges: one engine per model id, each loaded on first use and
    kept (a committee member is drawn again and again). A receipt for a model id it does not
    hold is its own limitation, an abstention (CannotJudgeError), never a vote."""

    def __init__(self, paths: Sequence[str | Path], kernels: str | EngineChoice = "invariant",
                 engines: Sequence[Engine] = ()) -> None:
        if not paths and not engines:
            raise ValueError("a verifier needs at least one model")
        self.paths = [Path(p) for p in paths]
        self.choice = EngineChoice.of(kernels)
        self._engines: dict[bytes, Engine] = {e.model_id: e for e in engines}
        self._ids: dict[Path, bytes] = {}  # path -> model id, hashed once
        self._fingerprints: dict[bytes, EngineFingerprint] = {}
        self._lock = threading.Lock()

    def ids(self) -> dict[bytes, Path]:
        """model id -> file, hashing the files not hashed yet."""
        with self._lock:
            for p in self.paths:
                if p not in self._ids:
                    self._ids[p] = model_file_id(p)
            return {mid: p for p, mid in self._ids.items()}

    def path_for(self, model_id: bytes) -> Path:
        p = self.ids().get(model_id)
        if p is None:
            known = ", ".join(sorted(map(to_hex, self.known()))) or "none"
            raise CannotJudgeError(f"request model {to_hex(model_id)} is not one of this "
                                   f"verifier's models ({known})", param="model_id")
        return p

    def known(self) -> set[bytes]:
        return set(self._engines) | set(self.ids())

    def fingerprint(self, model_id: bytes) -> EngineFingerprint:
        """The fingerprint of the engine that judges ``model_id`` (what the enclave
        measurement binds), computed without loading that engine. Per model: vLLM's names the
        exported weights. A model this verifier does not hold gets its first model's (the
        enclave that opens such an envelope runs that engine; the job then abstains)."""
        ids = self.ids()
        if model_id not in self._engines and model_id not in ids:
            model_id = self._ids[self.paths[0]] if self.paths else next(iter(self._engines))
        eng = self._engines.get(model_id)
        if eng is not None:
            return eng.fingerprint
        with self._lock:
            fp = self._fingerprints.get(model_id)
        if fp is None:
            fp = self.choice.fingerprint(ids[model_id])
            with self._lock:
                self._fingerprints[model_id] = fp
        return fp

    def __call__(self, model_id: bytes) -> Engine:
        """The engine for ``model_id`` (an :data:`EngineResolver`)."""
        eng = self._engines.get(model_id)
        if eng is not None:
            return eng
        eng = engine_for(self.path_for(model_id), self.choice)
        if eng.model_id != model_id:  # the file changed since it was hashed
            raise CannotJudgeError(f"model file now holds {to_hex(eng.model_id)}, not "
                                   f"{to_hex(model_id)}", param="model_id")
        with self._lock:
            self._engines[model_id] = eng
        return eng


def verify_receipt_job(private_key: EpochPrivateKey | EnvelopeOpener, *,
                       receipt: dict[str, Any], blob: bytes | None, model_path: str = "",
                       models: dict[str, str] | None = None,
                       kernels: str = "invariant",
                       backend: dict[str, Any] | None = None) -> dict[str, Any]:
    """Enclave job (``verinfer.verifier.reexec:verify_receipt_job``): ``f(private_key, **args)``
    where ``private_key`` is the epoch key (legacy suites) or an opener of this one envelope
    (per-receipt threshold decryption). ``receipt`` is the EIP-712 message JSON; ``blob`` the
    ciphertext from DA (None: absent); ``models`` maps model ids to files (the parent hashed
    them: only the model the request names is loaded), ``model_path`` is the one-model form.
    ``backend``: the :class:`EngineChoice` JSON (default: the own engine with ``kernels``).
    Returns the verdict JSON (vote + reason), never plaintext, or ``{"abstain": why}`` when
    this verifier holds no engine for the request's model (an abstention, not an error: the
    parent must not retry it as a fault of its own)."""
    r = Receipt.from_json(receipt)
    choice = EngineChoice.from_json(backend) if backend is not None else EngineChoice.of(kernels)
    engines: Engine | EngineResolver
    if models:
        by_id = {parse_hex(k, 32, "models key"): v for k, v in models.items()}

        def engines(model_id: bytes) -> Engine:
            path = by_id.get(model_id)
            if path is None:
                raise CannotJudgeError(f"request model {to_hex(model_id)} is not one of this "
                                       "verifier's models", param="model_id")
            return engine_for(path, choice)
    elif model_path:
        engines = engine_for(model_path, choice)
    else:
        raise ValueError("verify_receipt_job needs model_path or models")
    try:
        return judge(engines, r, blob, private_key).to_json()
    except CannotJudgeError as e:
        return {"abstain": e.message[:500]}
