"""Answers as an operator sends them, for the verified client's tests: the cheat factory's
Evidence (verinfer.testing.evidence) turned into the response an OpenAI-compatible operator
returns — the ``verification`` object built from the sealed envelope's own ExecRequest and
ExecResult — and a cheating operator that serves such answers over real HTTP (loopback)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from verinfer.protocol.hexutil import to_hex
from verinfer.receipts.eip712 import Receipt, ReceiptSigner
from verinfer.receipts.envelope import open_envelope
from verinfer.receipts.epoch_keys import EpochPrivateKey
from verinfer.receipts.signed import SignedReceipt
from verinfer.testing.evidence import Evidence


@dataclass(frozen=True)
class Resigned(Evidence):
    """Evidence whose receipt was changed and signed again after sealing: its envelope is
    still bound to the receipt it was sealed for."""

    sealed_for: Receipt | None = None


def verification_entry(ev: Evidence, sk: EpochPrivateKey) -> dict[str, Any]:
    """The operator's verification object for one choice (operator/evidence.py's entry)."""
    c = open_envelope(ev.blob, getattr(ev, "sealed_for", None) or ev.signed.receipt, sk)
    s = ev.signed
    return {"version": 1, "receipt_id": to_hex(s.digest),
            "receipt": s.receipt.as_typed_data(s.domain), "signature": to_hex(s.signature),
            "operator": s.receipt.operator, "req_hash": to_hex(c.request.hash),
            "out_hash": to_hex(c.result.hash), "seed": c.request.seed,
            "key_epoch": s.receipt.key_epoch, "exec_request": c.request.to_json(),
            "exec_result": c.result.to_json()}


def resigned(ev: Evidence, signer: ReceiptSigner, **fields: Any) -> Evidence:
    """The same evidence with receipt fields changed and signed again by ``signer`` (an
    operator signing what it likes; ``signer`` another key: a forgery)."""
    s = ev.signed
    return Resigned(SignedReceipt.sign(replace(s.receipt, **fields), s.domain, signer),
                    ev.blob, ev.request_body, ev.text,
                    sealed_for=getattr(ev, "sealed_for", None) or s.receipt)


def chat_response(ev: Evidence, sk: EpochPrivateKey, *, text: str | None = None
                  ) -> dict[str, Any]:
    """A non-streamed chat completion carrying ``ev``; ``text``: what the client is sent
    instead of the signed text (a change in transit)."""
    entry = verification_entry(ev, sk)
    res = entry["exec_result"]
    return {"id": "chatcmpl-test", "object": "chat.completion", "created": int(time.time()),
            "model": "tiny", "verification": entry,
            "choices": [{"index": 0, "finish_reason": res["finish_reason"],
                         "message": {"role": "assistant",
                                     "content": ev.text if text is None else text}}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}


def chat_chunks(ev: Evidence, sk: EpochPrivateKey, *, text: str | None = None
                ) -> list[dict[str, Any]]:
    """The same answer as SSE chunks: the text in two deltas, the finish reason, then a last
    chunk with no choices that carries the verification object (as the operator streams)."""
    body = ev.text if text is None else text
    entry = verification_entry(ev, sk)
    base = {"id": "chatcmpl-test", "object": "chat.completion.chunk",
            "created": int(time.time()), "model": "tiny"}
    half = len(body) // 2
    deltas = [{"role": "assistant", "content": body[:half]}, {"content": body[half:]}]
    out = [{**base, "choices": [{"index": 0, "delta": d, "finish_reason": None}]}
           for d in deltas]
    out.append({**base, "choices": [{"index": 0, "delta": {},
                                     "finish_reason": entry["exec_result"]["finish_reason"]}]})
    out.append({**base, "choices": [], "verification": entry})
    return out


Answer = Callable[[bytes], tuple[Evidence, str | None]]


@contextmanager
def cheating_operator(answer: Answer, sk: EpochPrivateKey) -> Iterator[str]:
    """An OpenAI-compatible chat endpoint on loopback that answers each body with
    ``answer(body) -> (evidence, text sent or None for the signed text)``; yields the base URL
    (…/v1)."""

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("content-length", "0")))
            ev, text = answer(body)
            if json.loads(body).get("stream"):
                data = b"".join(b"data: " + json.dumps(c).encode() + b"\n\n"
                                for c in chat_chunks(ev, sk, text=text)) + b"data: [DONE]\n\n"
                ctype = "text/event-stream"
            else:
                data, ctype = json.dumps(chat_response(ev, sk, text=text)).encode(), \
                    "application/json"
            self.send_response(200)
            self.send_header("content-type", ctype)
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    finally:
        server.shutdown()
        server.server_close()
