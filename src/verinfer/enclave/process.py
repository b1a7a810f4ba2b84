"""SoftwareEnclave as a separate OS process (multiprocessing, spawn). NOT a security boundary:
the host can read its memory and whoever holds the attestation root key can forge its quotes.

The parent (the verifier node) keeps the requester key: the child asks it, over the pipe, to
sign the request digest it computed. The child holds the ephemeral key, the shares and the
epoch key; only the job's result comes back.
"""

from __future__ import annotations

import multiprocessing as mp
import time
from collections.abc import Mapping
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from verinfer.enclave.errors import EnclaveError, KeyReleaseError
from verinfer.enclave.runner import JobOutcome, RequesterSigner


@dataclass(frozen=True)
class EnclaveSpec:
    root_key: Path  # SoftwareEnclave attestation root (private) key file
    container_digest: str
    code_hash: str
    engine_fingerprint: str
    directory: Path  # shards.json
    registry: Path  # epochs.json
    http_timeout_s: float = 5.0


class _PipeSigner:
    def __init__(self, conn: Connection, address: str) -> None:
        self._conn = conn
        self._address = address

    @property
    def address(self) -> str:
        return self._address

    def sign(self, digest: bytes) -> bytes:
        self._conn.send(("sign", digest))
        sig = self._conn.recv()
        if not isinstance(sig, bytes):
            raise EnclaveError("parent refused to sign the release request")
        return sig


def _child(conn: Connection, spec: EnclaveSpec, requester: str, job_ref: str,
           job_args: dict[str, Any], epoch: int, purpose: str, challenge_id: str) -> None:
    from verinfer.enclave.attestation import measurement
    from verinfer.enclave.jobs import resolve_job
    from verinfer.enclave.runner import EnclaveRunner
    from verinfer.enclave.software import SoftwareAttester, load_root_private
    from verinfer.errors import VerinferError
    from verinfer.kms.directory import load_directory
    from verinfer.kms.epochs import FileEpochRegistry

    try:
        attester = SoftwareAttester(
            load_root_private(spec.root_key),
            measurement(spec.container_digest, spec.code_hash, spec.engine_fingerprint),
            time.time)
        runner = EnclaveRunner(attester=attester, shards=load_directory(spec.directory),
                               epochs=FileEpochRegistry(spec.registry),
                               signer=_PipeSigner(conn, requester),
                               timeout_s=spec.http_timeout_s)
        job = resolve_job(job_ref)
        out = runner.run(lambda key: job(key, **job_args), epoch=epoch, purpose=purpose,
                         challenge_id=challenge_id)
        conn.send(("result", out))
    except KeyReleaseError as e:
        conn.send(("key_release_error", e.message, e.refusals, e.corrupt_shards))
    except VerinferError as e:
        conn.send(("error", type(e).__name__, e.message))
    except Exception as e:
        conn.send(("error", type(e).__name__, str(e)))
    finally:
        conn.close()


class SoftwareEnclave:
    """Run ``job_ref`` (``module:function``, called as ``f(private_key, **job_args)``) in a
    fresh child process that obtains the epoch key from the shards. Not a security boundary."""

    def __init__(self, spec: EnclaveSpec, signer: RequesterSigner) -> None:
        self.spec = spec
        self.signer = signer

    def run(self, job_ref: str, job_args: Mapping[str, Any] | None = None, *, epoch: int,
            purpose: str, challenge_id: str, timeout_s: float = 120.0) -> JobOutcome[Any]:
        ctx = mp.get_context("spawn")
        parent, child = ctx.Pipe()
        proc = ctx.Process(target=_child, name="verinfer-software-enclave",
                           args=(child, self.spec, self.signer.address, job_ref,
                                 dict(job_args or {}), epoch, purpose, challenge_id))
        proc.start()
        child.close()
        deadline = time.monotonic() + timeout_s
        try:
            while True:
                if not parent.poll(max(0.0, deadline - time.monotonic())):
                    raise EnclaveError(f"software enclave gave no answer in {timeout_s}s")
                try:
                    msg = parent.recv()
                except EOFError as e:
                    raise EnclaveError("software enclave exited without an answer") from e
                if msg[0] == "sign":
                    parent.send(self.signer.sign(msg[1]))
                elif msg[0] == "result":
                    out: JobOutcome[Any] = msg[1]
                    return out
                elif msg[0] == "key_release_error":
                    raise KeyReleaseError(msg[1], refusals=msg[2], corrupt_shards=msg[3])
                else:
                    raise EnclaveError(f"software enclave failed: {msg[1]}: {msg[2]}")
        finally:
            parent.close()
            proc.join(timeout=10)
            if proc.is_alive():
                proc.kill()
                proc.join()
