"""`verinfer reproduce` benchmark: an auditor's whole check of one receipt for a 64-token answer
of the embedded Gemma 3 270M, against the time the operator's engine took to generate it.

Run from the repository root: ``.venv/bin/python bench/reproduce.py [--model FILE]`` (or
``verinfer bench reproduce``). Prints progress lines, then one JSON object as the last line.

Method (one process, one run, so the ratio shares the machine's noise): an operator's evidence
is made with the library (testing/evidence.py: the request rule, the engine, the envelope
sealed to a P-256 key epoch, an EIP-712 receipt), its ciphertext put on a local DA store. Then,
in rounds, the operator's generation of the answer (``Engine.generate``, 64 tokens) and the
auditor's full check (``Auditor.run``: signature, DA fetch and hash, envelope opening with the
app key, model file sha256, tokenizer and fingerprint comparison, the request rule, one replay
pass) alternate; medians are reported. The engine is loaded once (an auditor checking receipts
in one process keeps it), but the model file is hashed again in every check. No chain: the
chain steps are RPC reads whose time depends on the node, not on this machine.

Then the same receipt is checked once per kernel ISA path the CPU has (``isa_results``): each
gives the logit digest and outHash of the operator's receipt, or the benchmark fails.

Keys: ``reproduce_s`` (median seconds of one check), ``generate_s`` (median seconds to generate
the answer), ``reproduce_over_generate`` (their ratio; the issue asks <= 0.5), ``replay_s``
(the replay step alone), ``steps_s`` (per step, of the median round), ``output_tokens``.
"""

from __future__ import annotations

import argparse
import json
import secrets
import statistics
import sys
import tempfile
import time
from pathlib import Path

from verinfer.auditor.material import load_app_key, write_app_key
from verinfer.auditor.reproduce import AuditConfig, Auditor
from verinfer.da_client.local import LocalDAClient
from verinfer.engine import kernels
from verinfer.engine.loader import resolve_model_path
from verinfer.receipts.eip712 import Domain, ReceiptSigner
from verinfer.receipts.epoch_keys import P256_ORDER, EnvelopeSuite, derive_epoch_keypair
from verinfer.testing.evidence import EvidenceFactory, request_for_body
from verinfer.verifier.reexec import engine_for

TOKENS = 64
ROUNDS = 3
PROMPTS = ("The history of the printing press begins in",
           "In the early morning the harbour was already busy with",
           "Chapter one. The old lighthouse stood at the edge of")


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="gemma3-270m", help="model file or shipped name")
    ap.add_argument("--rounds", type=int, default=ROUNDS)
    args = ap.parse_args()
    path = resolve_model_path(args.model)
    with tempfile.TemporaryDirectory(prefix="verinfer-bench-reproduce-") as tmp:
        run(path, Path(tmp), args.rounds)


def run(path: Path, work: Path, rounds: int) -> None:
    engine = engine_for(path)
    scalar = 1 + secrets.randbelow(P256_ORDER - 1)
    seed = scalar.to_bytes(32, "big")
    _, public = derive_epoch_keypair(seed, EnvelopeSuite.P256)
    key_file = work / "app-key.json"
    write_app_key(key_file, EnvelopeSuite.P256.value, seed, 1)
    factory = EvidenceFactory(engine, ReceiptSigner("0x" + secrets.token_hex(32)),
                              Domain(31337, "0x" + "11" * 20), key_epoch=1,
                              epoch_public_key=public)
    body = request = None
    for prompt in PROMPTS:  # a base model rarely stops early; take a prompt that runs to 64
        body = json.dumps({"model": "bench", "prompt": prompt, "max_tokens": TOKENS,
                           "temperature": 0}).encode()
        request = request_for_body(engine, body)
        if len(engine.generate(list(request.prompt_token_ids),
                               request.sampling_params()).token_ids) == TOKENS:
            break
    assert body is not None and request is not None
    ev = factory.honest(body)
    da = LocalDAClient(work / "da")
    da.put(ev.blob)
    ref = work / "receipt.json"
    ref.write_text(json.dumps(ev.signed.to_json()))
    auditor = Auditor(AuditConfig(models=[str(path)], app_key=load_app_key(key_file),
                                  da_backends=["local"]), da=da)
    gen_s, rep = [], []
    for i in range(rounds):
        t = time.perf_counter()
        gen = engine.generate(list(request.prompt_token_ids), request.sampling_params())
        gen_s.append(time.perf_counter() - t)
        t = time.perf_counter()
        report = auditor.run(str(ref))
        rep.append((time.perf_counter() - t, report))
        assert report.verdict.outcome == "reproduced", report.to_json()
        log(f"round {i}: generate {gen_s[-1]:.3f}s ({len(gen.token_ids)} tokens), "
            f"reproduce {rep[-1][0]:.3f}s")
    rep.sort(key=lambda x: x[0])
    median_s, median_report = rep[len(rep) // 2]
    steps = median_report.facts["seconds"]
    isa_results = {}
    for isa in kernels.supported_isas():
        with kernels.forced_isa(isa):
            report = auditor.run(str(ref))
        replay = report.step("replay")
        assert report.verdict.outcome == "reproduced" and replay is not None, (isa, report)
        isa_results[isa] = {"verdict": report.verdict.outcome,
                            "logit_digest": replay.data["logit_digest"],
                            "out_hash": replay.data["out_hash"],
                            "replay_s": report.facts["seconds"]["replay"]}
        log(f"{isa}: {isa_results[isa]}")
    assert len({r["out_hash"] for r in isa_results.values()}) == 1
    generate_s = statistics.median(gen_s)
    print(json.dumps({
        "model": path.name, "output_tokens": len(gen.token_ids), "rounds": rounds,
        "reproduce_s": round(median_s, 4), "generate_s": round(generate_s, 4),
        "reproduce_over_generate": round(median_s / generate_s, 4),
        "replay_s": steps["replay"], "steps_s": steps, "isa_results": isa_results,
        "same_bits_on_every_isa": True, "kernel_isa_default": kernels.isa(),
    }))


if __name__ == "__main__":
    main()
