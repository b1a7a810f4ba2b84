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
A client's own transcript (no key ever held) is the other form::

    {"request": <the request body it sent, object or string>,
     "response": <the (non-streamed) API response it received>}

the ExecRequest is rebuilt from the body by the request rule (it reads values, so the body's
byte layout does not matter), the ExecResult from the answering choice's ``verinfer`` evidence
and text.
Both files are read with the bounded JSON parser: whoever handed them over may be hostile.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from verinfer.errors import BadInputError, VerinferError
from verinfer.protocol.exec_request import ExecRequest
from verinfer.protocol.hexutil import parse_hex, to_hex
from verinfer.protocol.jsonsafe import loads_untrusted
from verinfer.receipts.canonical import ExecResult
from verinfer.receipts.envelope import EnvelopeContents
from verinfer.receipts.epoch_keys import EpochPrivateKey, derive_epoch_keypair

TRANSCRIPT_FORMAT = "verinfer-transcript/v1"
#: Bodies are bounded by the protocol's limits; a transcript is a little more than two of them.
MAX_FILE_BYTES = 64 << 20


class AuditInputError(BadInputError):
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
    doc: dict[str, Any] = {"suite": suite, "secret": to_hex(seed)}
    if key_epoch is not None:
        doc["key_epoch"] = key_epoch
    path.touch(mode=0o600)
    path.write_text(_dumps(doc))


@dataclass(frozen=True)
class ClientTranscript:
    """What a client kept of its own exchange: the request body it sent and the API response
    (non-streamed) it got. The ExecRequest is rebuilt from the body by the request rule once
    the model is loaded; the ExecResult from the response's choices (each carries its output
    token ids and logit digest in ``verinfer``)."""

    request_body: bytes
    response: dict[str, Any]
    response_body: bytes

    def results(self) -> list[ExecResult]:
        """One candidate ExecResult per choice (the receipt's is the one of its outHash)."""
        choices = self.response.get("choices")
        if not isinstance(choices, list) or not choices:
            raise AuditInputError("the transcript's response has no choices", param="transcript")
        out = []
        for i, c in enumerate(choices):
            try:
                ev = c["verinfer"]
                text = c["message"]["content"] if "message" in c else c["text"]
                if text is not None and not isinstance(text, str):
                    raise TypeError(f"its text is a {type(text).__name__}, not a string")
                if c.get("logprobs") is not None:
                    raise AuditInputError("a client transcript with logprobs cannot be checked "
                                          "(their float encoding is the envelope's): use an "
                                          "envelope transcript", param="transcript")
                out.append(ExecResult(
                    output_token_ids=tuple(ev["output_token_ids"]),
                    finish_reason=c["finish_reason"],
                    logit_digest=parse_hex(ev["logit_digest"], 32, "logit_digest"),
                    text_sha256=hashlib.sha256((text or "").encode()).digest()))
            except AuditInputError:
                raise
            except (KeyError, TypeError, VerinferError) as e:
                raise AuditInputError(f"the transcript's choice {i} is not a verinfer answer "
                                      f"({type(e).__name__}: {str(e)[:120]})",
                                      param="transcript") from None
        return out


def load_transcript(path: Path | str) -> EnvelopeContents | ClientTranscript:
    doc = _read_json(path, "transcript")
    if isinstance(doc, dict) and "format" not in doc and {"request", "response"} <= set(doc):
        return _client_transcript(doc)
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


def _client_transcript(doc: dict[str, Any]) -> ClientTranscript:
    req, resp = doc["request"], doc["response"]
    if isinstance(req, str):
        body = req.encode()
    elif isinstance(req, dict):  # the rule reads values, not the bytes' layout
        body = json.dumps(req, separators=(",", ":")).encode()
    else:
        raise AuditInputError("the transcript's request must be the body (object or string)",
                              param="transcript")
    if not isinstance(resp, dict):
        raise AuditInputError("the transcript's response must be the API response object "
                              "(a streamed answer: use an envelope transcript)",
                              param="transcript")
    return ClientTranscript(body, resp, json.dumps(resp, separators=(",", ":")).encode())


def transcript_json(contents: EnvelopeContents, receipt_id: str) -> dict[str, Any]:
    try:
        bodies = [b.decode() for b in (contents.request_body, contents.response_body)]
    except UnicodeDecodeError:
        raise AuditInputError("the envelope's bodies are not UTF-8 text: no transcript "
                              "written", param="transcript") from None
    return {"format": TRANSCRIPT_FORMAT, "receipt_id": receipt_id,
            "exec_request": to_hex(contents.request.canonical),
            "exec_result": to_hex(contents.result.canonical),
            "request_body": bodies[0], "response_body": bodies[1],
            "readable": {"exec_request": contents.request.to_json(),
                         "exec_result": contents.result.to_json()}}


def save_transcript(path: Path, contents: EnvelopeContents, receipt_id: str) -> None:
    path.write_text(_dumps(transcript_json(contents, receipt_id)))


def _dumps(doc: dict[str, Any]) -> str:
    return json.dumps(doc, indent=2) + "\n"
