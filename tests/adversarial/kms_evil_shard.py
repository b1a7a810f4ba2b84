"""A malicious KMS shard, run as its own process by the adversarial KMS tests.

    python kms_evil_shard.py --port P --index I --mode MODE --record FILE [--peer URL ...]

Modes:
  nested-nonce    /v1/nonce answers a 190 KB ``[[[...]]]`` body (200, application/json)
  nested-release  /v1/nonce answers a well-formed nonce; /v1/release answers a 60 KB bomb
                  (30k deep: under the runner's size bound, refused by the depth bound)
  forward         /v1/release: forwards the exact body it received to every peer, then refuses
  tamper          /v1/release: forwards a copy with another enclave key to every peer (trying to
                  burn their nonces), then refuses
What the peers answered is appended to ``--record`` (one JSON line per forward), so the tests
can show the attack was carried out, not just that the release worked.
"""

from __future__ import annotations

import argparse
import json
import secrets
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx

BOMB = b"[" * 95_000 + b"]" * 95_000  # 190 KB
SMALL_BOMB = b"[" * 30_000 + b"]" * 30_000  # 60 KB: under the runner's size bound, so depth


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--index", type=int, required=True)
    ap.add_argument("--mode", required=True,
                    choices=["nested-nonce", "nested-release", "forward", "tamper"])
    ap.add_argument("--record", required=True)
    ap.add_argument("--peer", action="append", default=[])
    args = ap.parse_args()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *a: object) -> None:
            pass

        def _send(self, status: int, body: bytes) -> None:
            self.send_response(status)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:
            if self.path == "/health":
                self._send(200, json.dumps({"status": "ok", "shard_index": args.index}).encode())
            else:
                self._send(404, b"{}")

        def do_POST(self) -> None:
            raw = self.rfile.read(int(self.headers.get("content-length") or 0))
            if self.path == "/v1/nonce":
                if args.mode == "nested-nonce":
                    return self._send(200, BOMB)
                return self._send(200, json.dumps({"shard_index": args.index,
                                                   "nonce": "0x" + secrets.token_hex(32),
                                                   "expires_at": 0}).encode())
            if self.path != "/v1/release":
                return self._send(404, b"{}")
            if args.mode == "nested-release":
                return self._send(200, SMALL_BOMB)
            body = json.loads(raw)
            if args.mode == "tamper":
                body["enclave_public_key"] = "0x" + secrets.token_hex(32)
            answers = {}
            for peer in args.peer:
                r = httpx.post(peer + "/v1/release", json=body, timeout=10)
                answers[peer] = [r.status_code, r.json().get("error", {}).get("reason")]
            with open(args.record, "a") as f:
                f.write(json.dumps({"mode": args.mode, "answers": answers}) + "\n")
            self._send(403, json.dumps({"error": {"reason": "not_committee_member",
                                                  "message": "no", "shard_index": args.index}
                                        }).encode())

    ThreadingHTTPServer(("127.0.0.1", args.port), Handler).serve_forever()


if __name__ == "__main__":
    main()
