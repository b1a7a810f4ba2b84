"""SoftwareEnclave as a separate OS process (multiprocessing, spawn). NOT a security boundary:
the host can read its memory and whoever holds the attestation root key can forge its quotes.

The parent (the verifier node) keeps the requester key: the child asks it, over the pipe, to
sign the request digest it computed. The child holds the ephemeral key, the shares and the
epoch key; only the job's result comes back.

Per-receipt threshold epochs (P-256, kms/tdh.py) have no epoch key to hand the job: there
:meth:`SoftwareEnclave.run_per_receipt` gives the job an *opener* instead, which decrypts one
receipt's envelope through ``EnclaveRunner.open_receipt`` (t partial decryptions, each checked
against its DLEQ proof) — the child learns that envelope's plaintext and nothing else.

What the child sends is untrusted bytes, never pickles: the child opens operator-supplied
evidence and runs the engine on it, and ``Connection.recv()`` unpickles, i.e. runs whatever
code the bytes name in the parent, which holds the verifier's account key. So each message is
length-bounded (``recv_bytes(maxlength)``), parsed with :func:`loads_untrusted` (size and depth
checked before the stdlib decoder: a nested-bracket bomb cannot crash the parent) and
shape-checked; anything else is an :class:`EnclaveError` (a local fault of this verifier).
"""

from __future__ import annotations

import multiprocessing as mp
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from verinfer.enclave.errors import EnclaveError, KeyReleaseError
from verinfer.enclave.runner import JobOutcome, RequesterSigner
from verinfer.protocol.hexutil import HexFormatError, parse_hex, to_hex
from verinfer.protocol.jsonsafe import UntrustedJsonError, loads_untrusted

#: Largest child message the parent reads (an opened envelope, hex-encoded, fits).
MAX_MESSAGE_BYTES = 32 * 1024 * 1024
#: A run signs one release request per key release attempt; more is a child probing the key.
MAX_SIGN_REQUESTS = 8
#: Deepest JSON a child message may have (a verdict is 2, an opened envelope 2).
MAX_MESSAGE_DEPTH = 16


@dataclass(frozen=True)
class EnclaveSpec:
    root_key: Path  # SoftwareEnclave attestation root (private) key file
    container_digest: str
    code_hash: str
    engine_fingerprint: str
    directory: Path  # shards.json
    registry: Path  # epochs.json
    http_timeout_s: float = 5.0


def _jsonable(v: Any) -> Any:
    """Job results as JSON: bytes as 0x-hex (the job result types are JSON and bytes)."""
    if isinstance(v, bytes | bytearray):
        return to_hex(bytes(v))
    if isinstance(v, Mapping):
        return {str(k): _jsonable(x) for k, x in v.items()}
    if isinstance(v, list | tuple):
        return [_jsonable(x) for x in v]
    if v is None or isinstance(v, str | int | float | bool):
        return v
    raise TypeError(f"job result of type {type(v).__name__} cannot leave the enclave")


def _encode_result(result: Any) -> tuple[str, Any]:
    """(result type, JSON value). Typed results are decoded by the parent's own parser."""
    from verinfer.receipts.envelope import EnvelopeContents

    if isinstance(result, EnvelopeContents):
        return "envelope_contents", to_hex(result.to_bytes())
    return "json", _jsonable(result)


def _decode_envelope_contents(v: Any) -> Any:
    from verinfer.receipts.envelope import EnvelopeContents

    return EnvelopeContents.from_bytes(_hex(v, "result"))


#: result type -> the parent's decoder of the child's JSON value (closed list: the child
#: cannot name a constructor).
_DECODERS: dict[str, Callable[[Any], Any]] = {
    "json": lambda v: v,
    "envelope_contents": _decode_envelope_contents,
}


def _hex(v: Any, what: str, length: int | None = None) -> bytes:
    try:
        b = parse_hex(v, field=what)
    except HexFormatError:  # the child's fault, not a client's: an enclave error
        raise EnclaveError(f"software enclave sent a malformed {what}: not 0x-hex") from None
    if length is not None and len(b) != length:
        raise EnclaveError(f"software enclave sent a {what} of {len(b)} bytes, not {length}")
    return b


def _int_list(v: Any, what: str) -> list[int]:
    if not isinstance(v, list) or len(v) > 1024 or not all(
            isinstance(x, int) and not isinstance(x, bool) for x in v):
        raise EnclaveError(f"software enclave sent a malformed {what}: not a list of ints")
    return list(v)


def _refusals(v: Any) -> dict[int, str]:
    if not isinstance(v, dict) or len(v) > 1024:
        raise EnclaveError("software enclave sent malformed refusals: not an object")
    out: dict[int, str] = {}
    for k, x in v.items():
        if not (k.isdigit() and len(k) < 10 and isinstance(x, str)):
            raise EnclaveError("software enclave sent malformed refusals: "
                               "want {shard index: reason}")
        out[int(k)] = x[:1000]
    return out


def _send(conn: Connection, msg: dict[str, Any]) -> None:
    import json

    conn.send_bytes(json.dumps(msg, allow_nan=False).encode())


class _PipeSigner:
    def __init__(self, conn: Connection, address: str) -> None:
        self._conn = conn
        self._address = address

    @property
    def address(self) -> str:
        return self._address

    def sign(self, digest: bytes) -> bytes:
        _send(self._conn, {"kind": "sign", "digest": to_hex(digest)})
        sig = self._conn.recv_bytes(256)
        if not sig:
            raise EnclaveError("parent refused to sign the release request")
        return sig


def _child(conn: Connection, spec: EnclaveSpec, requester: str, job_ref: str,
           job_args: dict[str, Any], epoch: int, purpose: str, challenge_id: str,
           per_receipt: bool = False, assignment: dict[str, Any] | None = None) -> None:
    from verinfer.attestation.quotes import measurement
    from verinfer.attestation.software import SoftwareAttester, load_root_private
    from verinfer.enclave.jobs import resolve_job
    from verinfer.enclave.runner import EnclaveRunner
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
        if per_receipt:
            out = _run_per_receipt(runner, job, job_args, purpose, challenge_id, assignment)
        else:
            out = runner.run(lambda key: job(key, **job_args), epoch=epoch, purpose=purpose,
                             challenge_id=challenge_id)
        rtype, value = _encode_result(out.result)
        _send(conn, {"kind": "result", "result_type": rtype, "result": value,
                     "shards_used": out.shards_used, "corrupt_shards": out.corrupt_shards,
                     "refusals": {str(k): v for k, v in out.refusals.items()},
                     "key_ms": out.key_ms})
    except KeyReleaseError as e:
        _send(conn, {"kind": "key_release_error", "message": e.message,
                     "refusals": {str(k): v for k, v in e.refusals.items()},
                     "corrupt_shards": list(e.corrupt_shards)})
    except VerinferError as e:
        _send(conn, {"kind": "error", "type": type(e).__name__, "message": e.message})
    except Exception as e:
        _send(conn, {"kind": "error", "type": type(e).__name__, "message": str(e)})
    finally:
        conn.close()


def _run_per_receipt(runner: Any, job: Callable[..., Any], job_args: dict[str, Any],
                     purpose: str, challenge_id: str,
                     assignment: dict[str, Any] | None) -> JobOutcome[Any]:
    """``job(opener, **job_args)``: the opener decrypts one envelope per call through the
    shards (their release policy decides which receipts this requester may open). The outcome
    reports the shards of the last opening and the time spent in openings; a job that decides
    without decrypting (e.g. a ciphertext hash mismatch) asked no shard at all."""
    from verinfer.enclave.errors import JobError
    from verinfer.errors import VerinferError
    from verinfer.kms.protocol import AuditAssignment
    from verinfer.receipts.eip712 import Receipt
    from verinfer.receipts.envelope import EnvelopeContents

    grant = AuditAssignment.from_json(assignment) if assignment is not None else None
    openings: list[Any] = []

    def opener(blob: bytes, receipt: Receipt) -> EnvelopeContents:
        o = runner.open_receipt(receipt=receipt, ciphertext=blob, purpose=purpose,
                                challenge_id=challenge_id, assignment=grant)
        openings.append(o)
        contents: EnvelopeContents = o.contents
        return contents

    try:
        result = job(opener, **job_args)
    except VerinferError:
        raise
    except Exception as e:
        raise JobError(f"job failed: {type(e).__name__}: {e}") from e
    last = openings[-1] if openings else None
    return JobOutcome(result, list(last.shards_used) if last else [],
                      list(last.corrupt_shards) if last else [],
                      dict(last.refusals) if last else {},
                      float(sum(o.ms for o in openings)))


def _message(raw: bytes) -> dict[str, Any]:
    try:
        msg = loads_untrusted(raw, max_bytes=MAX_MESSAGE_BYTES, depth=MAX_MESSAGE_DEPTH,
                              what="software enclave message")
    except UntrustedJsonError as e:
        raise EnclaveError(f"software enclave sent unreadable bytes: {e.message}") from e
    if not isinstance(msg, dict) or not isinstance(msg.get("kind"), str):
        raise EnclaveError("software enclave sent a message without a kind")
    return msg


def _outcome(msg: dict[str, Any]) -> JobOutcome[Any]:
    decode = _DECODERS.get(msg.get("result_type"))  # type: ignore[arg-type]
    if decode is None:
        raise EnclaveError(f"software enclave sent an unknown result type "
                           f"{str(msg.get('result_type'))[:40]!r}")
    key_ms = msg.get("key_ms")
    if not isinstance(key_ms, int | float) or isinstance(key_ms, bool):
        raise EnclaveError("software enclave sent a malformed key_ms")
    try:
        result = decode(msg.get("result"))
    except EnclaveError:
        raise
    except Exception as e:  # the typed decoders raise their own error types
        raise EnclaveError(f"software enclave sent an undecodable result: {e}") from e
    return JobOutcome(result, _int_list(msg.get("shards_used"), "shards_used"),
                      _int_list(msg.get("corrupt_shards"), "corrupt_shards"),
                      _refusals(msg.get("refusals")), float(key_ms))

class SoftwareEnclave:
    """Run ``job_ref`` (``module:function``, called as ``f(private_key, **job_args)``) in a
    fresh child process that obtains the epoch key from the shards — or, for per-receipt
    epochs, ``f(opener, **job_args)`` (:meth:`run_per_receipt`). Not a security boundary."""

    #: The child's entry point (spawned by reference). Adversarial tests put a hostile child
    #: here to show the parent survives whatever a compromised child writes.
    child_main: Callable[..., None] = staticmethod(_child)

    def __init__(self, spec: EnclaveSpec, signer: RequesterSigner) -> None:
        self.spec = spec
        self.signer = signer

    def run(self, job_ref: str, job_args: Mapping[str, Any] | None = None, *, epoch: int,
            purpose: str, challenge_id: str, timeout_s: float = 120.0) -> JobOutcome[Any]:
        """The legacy path: the child rebuilds epoch ``epoch``'s key and calls
        ``f(private_key, **job_args)``."""
        return self._run(job_ref, job_args, epoch, purpose, challenge_id, timeout_s,
                         False, None)

    def run_per_receipt(self, job_ref: str, job_args: Mapping[str, Any] | None = None, *,
                        purpose: str, challenge_id: str,
                        assignment: Mapping[str, Any] | None = None,
                        timeout_s: float = 120.0) -> JobOutcome[Any]:
        """Per-receipt threshold epochs: the child calls ``f(opener, **job_args)`` where
        ``opener(ciphertext, receipt)`` decrypts that one envelope (``EnclaveRunner.
        open_receipt``, ``assignment`` the light-audit assignment JSON if any). No epoch key
        exists in the child. ``key_ms`` is the time spent opening."""
        return self._run(job_ref, job_args, 0, purpose, challenge_id, timeout_s, True,
                         dict(assignment) if assignment is not None else None)

    def _run(self, job_ref: str, job_args: Mapping[str, Any] | None, epoch: int,
             purpose: str, challenge_id: str, timeout_s: float, per_receipt: bool,
             assignment: dict[str, Any] | None) -> JobOutcome[Any]:
        ctx = mp.get_context("spawn")
        parent, child = ctx.Pipe()
        proc = ctx.Process(target=type(self).child_main, name="verinfer-software-enclave",
                           args=(child, self.spec, self.signer.address, job_ref,
                                 dict(job_args or {}), epoch, purpose, challenge_id,
                                 per_receipt, assignment))
        proc.start()
        child.close()
        deadline = time.monotonic() + timeout_s
        signed = 0
        try:
            while True:
                if not parent.poll(max(0.0, deadline - time.monotonic())):
                    raise EnclaveError(f"software enclave gave no answer in {timeout_s}s")
                try:
                    raw = parent.recv_bytes(MAX_MESSAGE_BYTES)
                except EOFError as e:
                    raise EnclaveError("software enclave exited without an answer") from e
                except OSError as e:  # longer than maxlength (the pipe is then unusable)
                    raise EnclaveError(f"software enclave sent a message over "
                                       f"{MAX_MESSAGE_BYTES} bytes") from e
                msg = _message(raw)
                kind = msg["kind"]
                if kind == "sign":
                    signed += 1
                    if signed > MAX_SIGN_REQUESTS:
                        raise EnclaveError(f"software enclave asked for more than "
                                           f"{MAX_SIGN_REQUESTS} signatures")
                    parent.send_bytes(self.signer.sign(_hex(msg.get("digest"), "digest", 32)))
                elif kind == "result":
                    return _outcome(msg)
                elif kind == "key_release_error":
                    raise KeyReleaseError(str(msg.get("message"))[:2000],
                                          refusals=_refusals(msg.get("refusals")),
                                          corrupt_shards=_int_list(msg.get("corrupt_shards"),
                                                                   "corrupt_shards"))
                elif kind == "error":
                    raise EnclaveError(f"software enclave failed: {str(msg.get('type'))[:80]}: "
                                       f"{str(msg.get('message'))[:2000]}")
                else:
                    raise EnclaveError(f"software enclave sent an unknown message kind "
                                       f"{kind[:40]!r}")
        finally:
            parent.close()
            proc.join(timeout=10)
            if proc.is_alive():
                proc.kill()
                proc.join()
