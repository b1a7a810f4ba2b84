"""The enclave flow around the re-execution job: fetch the ciphertext from DA, then inside the
enclave quote -> t shares from the KMS shards -> epoch key -> job -> zeroize; only the verdict
comes back.

Two modes (docs/verifier.md §4): ``inprocess`` runs the SoftwareEnclave runner in the node's
process with resident engines (each model loaded once, on first use; used by the devnet and
benchmark); ``process`` spawns a fresh SoftwareEnclave child per job (``verinfer enclave``
semantics; the child loads the request's model each time). Both decrypt per receipt for
threshold (P-256) epochs. Neither is a security boundary (docs/kms.md).

A verifier holds one engine per approved model it serves (``model_path`` and
``more_models``), all of one backend (``engine``: the own engine or vLLM,
``verinfer.engine.backends``): the request's model id picks it; a model it does not hold is an
abstention. The enclave measurement binds the fingerprint of the engine that judges the
receipt's model — per model, since vLLM's fingerprint names the exported weights.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Protocol

from eth_account.signers.local import LocalAccount

from verinfer.attestation.quotes import measurement
from verinfer.attestation.software import SoftwareAttester, load_root_private
from verinfer.chain.structs import INVALID_EVIDENCE
from verinfer.da_client.errors import (
    BackendMismatchError,
    BlobNotFoundError,
    CommitmentMismatchError,
    DAUnavailableError,
    MalformedPointerError,
)
from verinfer.da_client.pointer import Pointer, mismatch_counts_as_absent
from verinfer.enclave.errors import EnclaveError
from verinfer.enclave.process import EnclaveSpec, SoftwareEnclave
from verinfer.enclave.runner import AccountSigner, EnclaveRunner
from verinfer.engine.backends import EngineChoice
from verinfer.engine.engine import Engine
from verinfer.kms.directory import load_directory
from verinfer.kms.epochs import FileEpochRegistry
from verinfer.kms.protocol import AuditAssignment
from verinfer.protocol.hexutil import to_hex
from verinfer.receipts.eip712 import Receipt
from verinfer.receipts.envelope import EnvelopeContents, ciphertext_hash
from verinfer.receipts.epoch_keys import EnvelopeSuite, EpochPrivateKey
from verinfer.verifier.errors import CannotJudgeError, EvidenceUnavailableError, LocalFault
from verinfer.verifier.reexec import JobClock, ModelSet, engine_for, judge
from verinfer.verifier.votes import Verdict

EnclaveMode = Literal["inprocess", "process"]
JOB_REF = "verinfer.verifier.reexec:verify_receipt_job"


class BlobSource(Protocol):
    def get(self, pointer: Pointer) -> bytes: ...


@dataclass(frozen=True)
class EnclaveConfig:
    root_key: Path  # SoftwareEnclave attestation root key
    directory: Path  # shards.json
    registry: Path  # epochs.json
    container_digest: str
    code_hash: str
    model_path: Path
    kernels: str = "invariant"
    mode: EnclaveMode = "inprocess"
    http_timeout_s: float = 5.0
    more_models: tuple[Path, ...] = ()  # further model files this verifier judges
    engine: EngineChoice | None = None  # the backend; None: the own engine with ``kernels``

    @property
    def model_paths(self) -> tuple[Path, ...]:
        return (self.model_path, *(p for p in self.more_models if p != self.model_path))

    @property
    def choice(self) -> EngineChoice:
        return self.engine if self.engine is not None else EngineChoice.of(self.kernels)


def fetch_blob(da: BlobSource, pointer: str | None) -> bytes | None:
    """The ciphertext, verified against its pointer by the DA client; None when DA answers
    that it does not exist, when an operator-hosted store holds other bytes under the pointer
    (``mismatch_counts_as_absent``), or when there is no well-formed pointer (nothing to fetch).
    EvidenceUnavailableError (a LocalFault) when this verifier's DA connection fails or an
    EigenDA proxy returns bytes that do not match the pointer: the node retries with backoff."""
    if pointer is None:
        return None
    try:
        p = Pointer.parse(pointer)
    except MalformedPointerError:
        return None
    try:
        return da.get(p)
    except (BlobNotFoundError, BackendMismatchError):
        # a pointer into another backend than the network's is as good as absent: the
        # operator chose where to publish
        return None
    except CommitmentMismatchError as e:
        if mismatch_counts_as_absent(p):  # the operator rewrote its own store: as deleted
            return None
        raise EvidenceUnavailableError(f"DA unavailable for {pointer}: {e.message}") from e
    except DAUnavailableError as e:
        raise EvidenceUnavailableError(f"DA unavailable for {pointer}: {e.message}") from e


def decided_without_key(receipt: Receipt, blob: bytes | None, *,
                        absent_is_fault: bool = True) -> Verdict | None:
    """Faults of the ciphertext itself are decided before any key is released (no KMS round,
    so a KMS outage cannot turn them into abstentions). ``absent_is_fault`` False (still
    inside the publication window): an absent blob is a LocalFault to retry, not a vote."""
    if blob is None:
        if not absent_is_fault:
            raise EvidenceUnavailableError("the ciphertext is not on DA yet (publication "
                                           "window still open)")
        return Verdict(INVALID_EVIDENCE, "ciphertext_unavailable", receipt.out_hash)
    if ciphertext_hash(blob) != receipt.ciphertext_hash:
        return Verdict(INVALID_EVIDENCE, "ciphertext_hash_mismatch", receipt.out_hash)
    return None


class EnclaveJudge:
    def __init__(self, cfg: EnclaveConfig, account: LocalAccount, da: BlobSource,
                 engine: Engine | None = None, *,
                 on_timings: Callable[[dict[str, float]], None] | None = None) -> None:
        """``on_timings`` (inprocess mode, benchmarks) receives each job's JobClock seconds
        plus ``key_release_*_s``: quote, t KMS shares, key assembly, before the job starts."""
        self.cfg, self.account, self.da = cfg, account, da
        self.on_timings = on_timings
        self.engine = engine
        if cfg.mode == "inprocess" and engine is None:
            # the first model loads now (a node that cannot load its model should fail at
            # start, not at its first challenge); the others when a request names them
            self.engine = engine_for(cfg.model_path, cfg.choice)
        self.models = ModelSet(list(cfg.model_paths), cfg.choice,
                               [self.engine] if self.engine is not None else [])

    def _fingerprint(self, model_id: bytes) -> str:
        """The fingerprint of the engine that judges ``model_id`` (the enclave measurement
        binds it): per model, since vLLM's names the exported weights (the own engine's is the
        same for every model). Computed without starting an engine (:class:`ModelSet`)."""
        return self.models.fingerprint(model_id).canonical().decode()

    def judge(self, receipt: Receipt, pointer: str | None, *, purpose: str,
              challenge_id: str, absent_is_fault: bool = True,
              assignment: AuditAssignment | None = None) -> Verdict:
        """The verdict on ``receipt``. Operator faults come back as INVALID_EVIDENCE verdicts;
        faults of this verifier's own side (DA connection, KMS quorum, enclave) raise
        :class:`LocalFault` so the caller retries."""
        blob = fetch_blob(self.da, pointer)
        early = decided_without_key(receipt, blob, absent_is_fault=absent_is_fault)
        if early is not None:
            return early
        try:
            return self._judge_in_enclave(receipt, blob, purpose, challenge_id, assignment)
        except EnclaveError as e:  # key release without quorum, shard answers, a dead child
            raise LocalFault(f"enclave/KMS: {e.message}") from e

    def _judge_in_enclave(self, receipt: Receipt, blob: bytes | None, purpose: str,
                          challenge_id: str,
                          assignment: AuditAssignment | None = None) -> Verdict:
        # Threshold (P-256) epochs: per-receipt decryption, the epoch key exists nowhere.
        per_receipt = EnvelopeSuite.parse(FileEpochRegistry(self.cfg.registry).get(
            receipt.key_epoch).suite).threshold_decapsulable
        if self.cfg.mode == "process":
            return self._judge_in_child(receipt, blob, purpose, challenge_id, assignment,
                                        per_receipt)
        models = self.models
        attester = SoftwareAttester(
            load_root_private(self.cfg.root_key),
            measurement(self.cfg.container_digest, self.cfg.code_hash,
                        self._fingerprint(receipt.model_id)),
            time.time)
        runner = EnclaveRunner(attester=attester, shards=load_directory(self.cfg.directory),
                               epochs=FileEpochRegistry(self.cfg.registry),
                               signer=AccountSigner(self.account),
                               timeout_s=self.cfg.http_timeout_s)
        start = JobClock()
        clock: list[JobClock] = []
        if per_receipt:
            assert blob is not None  # decided_without_key handled the absent blob

            def opener(b: bytes, r: Receipt) -> EnvelopeContents:
                # decryption time (nonces, quote, t partials, open) lands in the
                # judge's "decrypt" phase
                return runner.open_receipt(receipt=r, ciphertext=b, purpose=purpose,
                                           challenge_id=challenge_id,
                                           assignment=assignment).contents

            job_clock = JobClock()
            verdict = judge(models, receipt, blob, opener, job_clock)
            if self.on_timings is not None:
                self.on_timings(job_clock.seconds)
            return verdict

        def job(key: EpochPrivateKey) -> Verdict:
            start.lap("key_release")
            clock.append(JobClock())
            return judge(models, receipt, blob, key, clock[0])

        outcome = runner.run(job, epoch=receipt.key_epoch, purpose=purpose,
                             challenge_id=challenge_id)
        if self.on_timings is not None and clock:
            self.on_timings({**start.seconds, **clock[0].seconds})
        return outcome.result

    def _judge_in_child(self, receipt: Receipt, blob: bytes | None, purpose: str,
                        challenge_id: str, assignment: AuditAssignment | None,
                        per_receipt: bool) -> Verdict:
        spec = EnclaveSpec(self.cfg.root_key, self.cfg.container_digest, self.cfg.code_hash,
                           self._fingerprint(receipt.model_id), self.cfg.directory,
                           self.cfg.registry, self.cfg.http_timeout_s)
        # the files are hashed here once (ModelSet caches the ids): the child loads only the
        # model the request names
        args = {"receipt": receipt.to_json(), "blob": blob, "kernels": self.cfg.kernels,
                "backend": self.cfg.choice.to_json(),
                "models": {to_hex(mid): str(p) for mid, p in self.models.ids().items()}}
        enclave = SoftwareEnclave(spec, AccountSigner(self.account))
        if per_receipt:
            out = enclave.run_per_receipt(
                JOB_REF, args, purpose=purpose, challenge_id=challenge_id,
                assignment=assignment.to_json() if assignment is not None else None)
        else:
            out = enclave.run(JOB_REF, args, epoch=receipt.key_epoch, purpose=purpose,
                              challenge_id=challenge_id)
        if isinstance(out.result, dict) and set(out.result) == {"abstain"}:
            # the child holds no engine for the request's model: abstain, do not retry
            raise CannotJudgeError(str(out.result["abstain"])[:500], param="model_id")
        try:  # the child's JSON (process.py bounds and parses it) must be a verdict
            return Verdict.from_json(out.result)
        except (KeyError, ValueError, TypeError, AttributeError) as e:
            raise EnclaveError(f"software enclave returned no verdict: {e!r:.200}") from e
