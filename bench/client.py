"""Verified client benchmark: what checking one answer costs the app.

Run from the repository root: ``.venv/bin/python bench/client.py``. Prints one JSON object as
the last line.

Set-up (real, on loopback): anvil with the contracts, a staked operator, its model and engine
fingerprint approved, a verifier declared, key epoch 1 live (verinfer.testing.client_chain); the
tiny test model written as a GGUF file; ``--answers`` chat answers made by the operator's own
issuer (the cheat factory's ``honest``), each with its verification object as the operator
sends it. Timed: ``Verifier.verify`` on one answer — parse the typed data, recover the
signature, the chain facts (cached: read once, then from the cache for ``ttl``), the request
rule on the body bytes (tokenize the prompt with the model's tokenizer, build the ExecRequest,
hash it), the output hash against the text received. ``client_verify_p50_ms`` is the median
over ``--rounds`` passes over every answer, after one warm-up pass that fills the cache
(``client_verify_cold_ms``: that first answer, chain reads included).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import tempfile
import time
from pathlib import Path

from verinfer.client import ClientModel, Received, Verifier
from verinfer.client.chain_view import ChainView
from verinfer.engine.engine import Engine
from verinfer.engine.loader import load_model
from verinfer.engine.tiny import write_tiny_llama
from verinfer.protocol.hexutil import to_hex
from verinfer.receipts.eip712 import ReceiptSigner
from verinfer.receipts.envelope import open_envelope
from verinfer.receipts.epoch_keys import EnvelopeSuite, derive_epoch_keypair
from verinfer.testing.client_chain import client_chain
from verinfer.testing.evidence import EvidenceFactory, chat_body


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--answers", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=50)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp, client_chain(Path(tmp)) as chain:
        model_path = Path(tmp) / "tiny.gguf"
        write_tiny_llama(model_path, seed=0)
        engine = Engine(load_model(model_path), "invariant")
        fp = hashlib.sha256(engine.fingerprint.canonical()).digest()
        chain.approve(engine.model_id, fp)
        sk, pk = derive_epoch_keypair(hashlib.sha256(b"bench epoch").digest(),
                                      EnvelopeSuite.X25519)
        factory = EvidenceFactory(engine, ReceiptSigner(bytes(chain.operator.key)),
                                  chain.domain, key_epoch=1, epoch_public_key=pk,
                                  now=time.time)
        answers = []
        for i in range(args.answers):
            ev = factory.honest(chat_body(f"question number {i}: why is the sea salty?",
                                          max_tokens=16, seed=i))
            c = open_envelope(ev.blob, ev.signed.receipt, sk)
            v = {"receipt_id": to_hex(ev.signed.digest),
                 "receipt": ev.signed.receipt.as_typed_data(ev.signed.domain),
                 "signature": to_hex(ev.signed.signature), "req_hash": to_hex(c.request.hash),
                 "out_hash": to_hex(c.result.hash), "exec_request": c.request.to_json(),
                 "exec_result": c.result.to_json()}
            answers.append((ev.request_body, v, [Received(ev.text, c.result.finish_reason)]))
        view = ChainView(chain.node.url, chain.deployment, ttl_s=3600)
        verifier = Verifier(view, {engine.model_id: ClientModel.from_gguf(model_path)})
        t0 = time.perf_counter()
        verifier.verify("chat", *answers[0])
        cold_ms = (time.perf_counter() - t0) * 1e3
        reads_after_warmup = view.reads
        times = []
        for _ in range(args.rounds):
            for body, v, got in answers:
                t = time.perf_counter()
                verifier.verify("chat", body, v, got)
                times.append((time.perf_counter() - t) * 1e3)
        times.sort()
        out = {
            "client_verify_p50_ms": round(statistics.median(times), 3),
            "client_verify_p90_ms": round(times[int(0.9 * (len(times) - 1))], 3),
            "client_verify_cold_ms": round(cold_ms, 3),
            "chain_reads_warmup": reads_after_warmup,
            "chain_reads_timed": view.reads - reads_after_warmup,
            "answers": args.answers, "verifications": len(times),
            "target_p50_ms": 2.0,
        }
        engine.close()
        print(json.dumps(out))


if __name__ == "__main__":
    main()
