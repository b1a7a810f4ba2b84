"""Receipt pipeline benchmark: what the operator adds to every response.

Run from the repository root: ``.venv/bin/python bench/receipts.py``. Prints one JSON object as
the last line.

Timed per response (a 4 KB completion: ~1,000 output tokens, 4,096 bytes of text, a 300-token
prompt, OpenAI request/response bodies as they would be enveloped): build + canonicalize +
hash the ExecRequest and ExecResult, build the envelope plaintext and HPKE-seal it to the
epoch key, build the receipt and compute its EIP-712 digest, sign it (libsecp256k1 via
coincurve over the digest; the same 65 bytes eth-account produces. eth-account's own
``unsafe_sign_hash`` is timed for reference: with coincurve installed eth_keys uses it too;
with its pure-Python fallback it took ~3 ms here). Wall time per iteration; p50/p90 over the run.
Sizes: ``receipt_bytes`` = ABI-encoded Receipt struct (10 words) + 65-byte signature, what a
challenge posts on chain; ``proof_bytes_1024`` = the largest inclusion proof in a batch of
1,024 receipts (32 bytes per sibling + 8-byte index + 8-byte leaf count).
"""

from __future__ import annotations

import hashlib
import json
import random
import statistics
import time
from dataclasses import dataclass

from eth_account import Account

from verinfer.protocol.exec_request import ExecRequest
from verinfer.protocol.sampling_params import SamplingParams
from verinfer.receipts.canonical import ExecResult
from verinfer.receipts.eip712 import Domain, Receipt, ReceiptSigner
from verinfer.receipts.envelope import EnvelopeBinding, EnvelopeContents, ciphertext_hash, seal
from verinfer.receipts.epoch_keys import EnvelopeSuite, EpochPublicKey, derive_epoch_keypair
from verinfer.receipts.merkle import build_tree

ITERATIONS = 600
WARMUP = 50
KEY = hashlib.sha256(b"bench operator").digest()
SIGNER = ReceiptSigner(KEY)
DOMAIN = Domain(31337, "0x5FbDB2315678afecb367f032d93F642f64180aa3")


@dataclass(frozen=True)
class Workload:
    text: str
    prompt: tuple[int, ...]
    output: tuple[int, ...]
    req_body: bytes
    resp_body: bytes
    logit_digest: bytes


def workload(rng: random.Random) -> Workload:
    text = "".join(rng.choice("abcdefghij klmnop qrstuv wxyz.,\n") for _ in range(4096))
    req_body = json.dumps({"model": "gemma-3-270m", "messages": [
        {"role": "user", "content": "x" * 1200}], "temperature": 0.7, "seed": 7}).encode()
    resp_body = json.dumps({"id": "chatcmpl-1", "object": "chat.completion", "choices": [
        {"index": 0, "message": {"role": "assistant", "content": text},
         "finish_reason": "length"}]}).encode()
    return Workload(text, tuple(rng.randrange(262_144) for _ in range(300)),
                    tuple(rng.randrange(262_144) for _ in range(1000)), req_body, resp_body,
                    hashlib.sha256(b"logits").digest())


def one_response(w: Workload, pk: EpochPublicKey, now: float) -> tuple[Receipt, bytes, bytes]:
    params = SamplingParams(max_tokens=1000, temperature=0.7, top_p=0.95, seed=7)
    req = ExecRequest.from_params(model_id=b"\x01" * 32, tokenizer_hash=b"\x02" * 32,
                                  engine_fingerprint='{"backend":"torch-cpu","version":2}',
                                  prompt_token_ids=w.prompt, params=params)
    res = ExecResult(output_token_ids=w.output, finish_reason="length",
                     logit_digest=w.logit_digest, text_sha256=hashlib.sha256(
                         w.text.encode()).digest())
    operator = SIGNER.address
    binding = EnvelopeBinding.for_execution(operator=operator, chain_id=31337, key_epoch=1,
                                            request=req, result=res)
    blob = seal(EnvelopeContents(req, res, w.req_body, w.resp_body), binding, pk)
    receipt = Receipt(operator=operator, chain_id=31337, model_id=req.model_id,
                      engine_fingerprint_hash=req.engine_fingerprint_hash, req_hash=req.hash,
                      out_hash=res.hash, key_epoch=1, ciphertext_hash=ciphertext_hash(blob),
                      issued_at=int(now))
    return receipt, SIGNER.sign(receipt, DOMAIN), blob


def timed(w: Workload, pk: EpochPublicKey) -> list[float]:
    out = []
    for i in range(WARMUP + ITERATIONS):
        t0 = time.perf_counter()
        one_response(w, pk, 1_700_000_000.0)
        if i >= WARMUP:
            out.append((time.perf_counter() - t0) * 1e3)
    return out


def pct(xs: list[float], q: float) -> float:
    return round(sorted(xs)[int(q * (len(xs) - 1))], 4)


def main() -> None:
    w = workload(random.Random(0))
    _, pk = derive_epoch_keypair(b"\x07" * 32, EnvelopeSuite.X25519)
    _, pk_pq = derive_epoch_keypair(b"\x07" * 32, EnvelopeSuite.MLKEM768_X25519)
    ms = timed(w, pk)
    ms_pq = timed(w, pk_pq)
    receipt, sig, blob = one_response(w, pk, 1_700_000_000.0)
    _, _, blob_pq = one_response(w, pk_pq, 1_700_000_000.0)
    digest = receipt.digest(DOMAIN)
    t0 = time.perf_counter()
    for _ in range(50):
        Account.unsafe_sign_hash(digest, KEY)
    eth_account_sign_ms = (time.perf_counter() - t0) / 50 * 1e3
    tree = build_tree([hashlib.sha256(i.to_bytes(4, "big")).digest() for i in range(1024)])
    proof_bytes = max(tree.proof(i).size_bytes for i in range(1024))
    plaintext_bytes = len(w.text.encode())
    result = {
        "p50_ms": pct(ms, 0.5),
        "p90_ms": pct(ms, 0.9),
        "mean_ms": round(statistics.fmean(ms), 4),
        "p50_ms_mlkem768_x25519": pct(ms_pq, 0.5),
        "target_p50_ms": 1.0,
        "iterations": ITERATIONS,
        "response_text_bytes": plaintext_bytes,
        "output_tokens": len(w.output),
        "receipt_bytes": len(receipt.encode_data()) - 32 + len(sig),
        "receipt_json_bytes": len(json.dumps(receipt.to_json(), separators=(",", ":"))),
        "signature_bytes": len(sig),
        "envelope_bytes": len(blob),
        "envelope_bytes_mlkem768_x25519": len(blob_pq),
        "proof_bytes_1024": proof_bytes,
        "proof_siblings_1024": len(tree.proof(0).siblings),
        "signer": "coincurve (libsecp256k1) over the EIP-712 digest",
        "eth_account_sign_ms": round(eth_account_sign_ms, 3),
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
