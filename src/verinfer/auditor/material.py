"""What the auditor holds besides the receipt: the app key (the HPKE private key of the key
epoch the envelope was sealed to) or a transcript (the envelope's plaintext, handed over by
someone who opened it).

Both files are JSON. An app key file::

    {"suite": "p256-hkdf-sha256-aes128gcm", "key_epoch": 1, "secret": "0x<32 bytes>"}

``secret`` is the epoch's 32-byte seed (receipts/epoch_keys.py derives the key pair from it).
A transcript (``verinfer reproduce --app-key K --save-transcript T`` writes one)::

    {"format": "verinfer-transcript/v1", "receipt_id": "0x…",
     "exec_request": "0x<canonical CBOR>", "exec_result": "0x<canonical CBOR>",
     "request_body": "<the OpenAI request body, as sent>",
     "response_body": "<the response body, before the verification object>",
     "readable": {"exec_request": {...}, "exec_result": {...}}}

Only the canonical CBOR counts (it is what reqHash/outHash hash); ``readable`` is for people.
Both files are read with the bounded JSON parser: whoever handed them over may be hostile.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from verinfer.errors import InvalidRequestError, VerinferError
from verinfer.protocol.hexutil import parse_hex
from verinfer.protocol.jsonsafe import loads_untrusted
from verinfer.receipts.canonical import ExecRequest, ExecResult
from verinfer.receipts.envelope import EnvelopeContents, EpochPrivateKey, derive_epoch_keypair

TRANSCRIPT_FORMAT = "verinfer-transcript/v1"
#: Bodies are bounded by the protocol's limits; a transcript is a little more than two of them.
MAX_FILE_BYTES = 64 << 20


class AuditInputError(InvalidRequestError):
    """An app key or transcript file the auditor passed is unreadable or malformed."""

    code = "audit_input"


@dataclass(frozen=True)
class AppKey:
    key: EpochPrivateKey
    key_epoch: int | None


def _read_json(path: Path | str, what: str) -> Any:
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as e:
        raise AuditInputError(f"cannot read the {what} {path}: {e.strerror}",
                              param=what) from None
    try:
        return loads_untrusted(data, max_bytes=MAX_FILE_BYTES, what=f"{what} {path}")
    except VerinferError as e:
        raise AuditInputError(f"the {what} {path} is not acceptable JSON: {e.message}",
                              param=what) from None


def load_app_key(path: Path | str) -> AppKey:
    doc = _read_json(path, "app key")
    if not isinstance(doc, dict) or not {"suite", "secret"} <= set(doc):
        raise AuditInputError(f"the app key {path} must be an object with suite and secret "
                              "(and optional key_epoch)", param="app_key")
    epoch = doc.get("key_epoch")
    if epoch is not None and (type(epoch) is not int or epoch < 0):
        raise AuditInputError("key_epoch must be a non-negative integer", param="key_epoch")
    try:
        seed = parse_hex(doc["secret"], 32, "secret")
        key, _ = derive_epoch_keypair(seed, doc["suite"])
    except VerinferError as e:
        raise AuditInputError(f"the app key {path}: {e.message}", param="app_key") from None
    return AppKey(key, epoch)


def write_app_key(path: Path, suite: str, seed: bytes, key_epoch: int | None) -> None:
    """The app key file format above (0600: it opens every envelope of the epoch)."""
    doc: dict[str, Any] = {"suite": suite, "secret": "0x" + seed.hex()}
    if key_epoch is not None:
        doc["key_epoch"] = key_epoch
    path.touch(mode=0o600)
    path.write_text(_dumps(doc))


def load_transcript(path: Path | str) -> EnvelopeContents:
    doc = _read_json(path, "transcript")
    keys = {"exec_request", "exec_result", "request_body", "response_body"}
    if not isinstance(doc, dict) or doc.get("format") != TRANSCRIPT_FORMAT \
            or not keys <= set(doc):
        raise AuditInputError(f"the transcript {path} must be a {TRANSCRIPT_FORMAT} object "
                              f"with {', '.join(sorted(keys))}", param="transcript")
    bodies = [doc[k] for k in ("request_body", "response_body")]
    if not all(isinstance(b, str) for b in bodies):
        raise AuditInputError("request_body and response_body must be strings",
                              param="transcript")
    try:
        request = ExecRequest.from_canonical(parse_hex(doc["exec_request"], None,
                                                       "exec_request"))
        result = ExecResult.from_canonical(parse_hex(doc["exec_result"], None, "exec_result"))
    except VerinferError as e:
        raise AuditInputError(f"the transcript {path}: {e.message}",
                              param="transcript") from None
    return EnvelopeContents(request, result, bodies[0].encode(), bodies[1].encode())


def transcript_json(contents: EnvelopeContents, receipt_id: str) -> dict[str, Any]:
    try:
        bodies = [b.decode() for b in (contents.request_body, contents.response_body)]
    except UnicodeDecodeError:
        raise AuditInputError("the envelope's bodies are not UTF-8 text: no transcript "
                              "written", param="transcript") from None
    return {"format": TRANSCRIPT_FORMAT, "receipt_id": receipt_id,
            "exec_request": "0x" + contents.request.canonical.hex(),
            "exec_result": "0x" + contents.result.canonical.hex(),
            "request_body": bodies[0], "response_body": bodies[1],
            "readable": {"exec_request": contents.request.to_json(),
                         "exec_result": contents.result.to_json()}}


def save_transcript(path: Path, contents: EnvelopeContents, receipt_id: str) -> None:
    path.write_text(_dumps(transcript_json(contents, receipt_id)))


def _dumps(doc: dict[str, Any]) -> str:
    import json

    return json.dumps(doc, indent=2) + "\n"
