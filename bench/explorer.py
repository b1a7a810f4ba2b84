"""Explorer page times with 10,000 receipts and 500 challenges on chain.

Populates a fresh anvil the way the protocol puts receipts there: receipts are signed with the
library (EIP-712, the operator's anvil dev key), their ciphertexts and the batch manifests go to a
local DA store, and only each batch's root goes on chain (``BatchRegistry.commitBatch``, one
transaction per batch of ``--batch-size``). Then ``--challenges`` receipts are challenged with
real ``openChallenge`` transactions (valid inclusion proofs, the bond), one in ten of them
naming an unapproved model so the contract slashes it at open (a resolved challenge and a
slash on the pages). Transactions are sent back to back with local nonces (anvil automines).

Then a real `verinfer explorer` process indexes the chain from the deployment block (timed:
``index_s``) and the bench requests its pages over HTTP, one at a time: the overview, the
operator (all its challenges), batch pages, receipt pages (signature recovery and Merkle proof
each), challenge pages, lists (receipts, operators, models; filtered by operator, model name
and status, deep pages), searches (ids and a model name) and their /api twins; the model
names come from a deployment model list (``--model-names``). Last line: JSON with
``p95_page_ms`` (target <= 300) and per-page-kind p50/p95.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
from eth_account.signers.local import LocalAccount
from web3 import Web3

from verinfer.chain.anvil import Anvil, dev_accounts
from verinfer.chain.bindings import Contracts, TxSender, receipt_tuple
from verinfer.chain.deploy import deploy_all
from verinfer.chain.structs import ETHER, Kind, Role
from verinfer.da_client.local import LocalDAClient
from verinfer.da_client.manifest import ManifestEntry, build_manifest
from verinfer.devnet.network import devnet_params
from verinfer.explorer.models import write_model_list
from verinfer.ports import free_port
from verinfer.receipts.eip712 import Domain, Receipt, ReceiptSigner
from verinfer.receipts.signed import SignedReceipt

MODEL_ID = b"\x11" * 32
MODEL_NAME = "bench-model-270m"
UNAPPROVED_MODEL_ID = b"\x12" * 32
FINGERPRINT = b"\x22" * 32


class FastSender:
    """Sends many transactions from one account without waiting for each: local nonces,
    fixed gas; waits for the last receipt, then checks every status."""

    def __init__(self, w3: Web3, account: LocalAccount) -> None:
        self.w3, self.account = w3, account
        self.nonce = w3.eth.get_transaction_count(account.address, "pending")
        self.hashes: list[Any] = []
        self.fees = {"maxFeePerGas": 10 * 10**9, "maxPriorityFeePerGas": 10**9}

    def send(self, fn: Any, value: int = 0, gas: int = 3_000_000) -> None:
        tx = fn.build_transaction({"from": self.account.address, "nonce": self.nonce,
                                   "gas": gas, "value": value, "chainId": 31337, **self.fees})
        self.nonce += 1
        signed = self.account.sign_transaction(tx)
        self.hashes.append(self.w3.eth.send_raw_transaction(signed.raw_transaction))

    def wait_all(self) -> None:
        for h in self.hashes:
            r = self.w3.eth.wait_for_transaction_receipt(h, timeout=120)
            if r["status"] != 1:
                raise RuntimeError(f"transaction {h.hex()} failed")
        self.hashes.clear()


def populate(w3: Web3, root: Path, n_receipts: int, batch_size: int, n_challenges: int
             ) -> dict[str, Any]:
    accts = dev_accounts(4)
    gov, operator, challenger = accts[0], accts[1], accts[2]
    d = deploy_all(w3, gov, devnet_params())
    d.save(root / "deployment.json")
    write_model_list(root / "models.json", {MODEL_NAME: MODEL_ID})
    g: Contracts = d.bind(w3, TxSender(w3, gov))
    g.config.approve(Kind.MODEL, MODEL_ID)
    g.config.approve(Kind.ENGINE_FINGERPRINT, FINGERPRINT)
    g.config.register_key_epoch(1, b"\x04" + b"\x01" * 64, b"\x33" * 32, 3, 5)
    ops = d.bind(w3, TxSender(w3, operator))
    ops.stakes.register(Role.OPERATOR, 2000 * ETHER)
    now = int(w3.eth.get_block("latest")["timestamp"])
    domain = Domain(d.chain_id, d.challenge_manager)
    signer = ReceiptSigner(operator.key)
    da = LocalDAClient(root / "da")
    t0 = time.monotonic()
    batches: list[tuple[Any, list[ManifestEntry]]] = []
    sender = FastSender(w3, operator)
    for start in range(0, n_receipts, batch_size):
        count = min(batch_size, n_receipts - start)
        blobs = [f"bench ciphertext {start + i}".encode() for i in range(count)]
        pointers = da.put_many(blobs)
        entries = []
        for i, ptr in enumerate(pointers):
            n = start + i
            # one receipt in ten (of those challenged) names an unapproved model
            model = UNAPPROVED_MODEL_ID if n % 200 == 10 else MODEL_ID
            r = Receipt(operator=operator.address, chain_id=d.chain_id, model_id=model,
                        engine_fingerprint_hash=FINGERPRINT, req_hash=n.to_bytes(32, "big"),
                        out_hash=(n * 7).to_bytes(32, "big"), key_epoch=1,
                        ciphertext_hash=ptr.blob_sha256, issued_at=now)
            entries.append(ManifestEntry(SignedReceipt.sign(r, domain, signer), ptr))
        m = build_manifest(entries)
        mptr = da.put(m.to_bytes())
        sender.send(ops.batches.contract.functions.commitBatch(m.root, m.leaf_count, str(mptr)))
        batches.append((m, entries))
    sender.wait_all()
    populate_batches_s = time.monotonic() - t0
    t1 = time.monotonic()
    ch = FastSender(w3, challenger)
    cm = d.bind(w3).challenges.contract
    bond = devnet_params().challenge_bond
    step = max(1, n_receipts // max(1, n_challenges))
    opened = []
    for k in range(n_challenges):
        n = (k * step + 10) % n_receipts  # with step 20: every tenth is n % 200 == 10
        m, entries = batches[n // batch_size]
        e = entries[n % batch_size]
        proof = m.proof(e.signed.digest)
        ch.send(cm.functions.openChallenge(receipt_tuple(e.signed.receipt), e.signed.signature,
                                           m.root, proof.index, list(proof.siblings)),
                value=bond)
        opened.append("0x" + e.signed.digest.hex())
    ch.wait_all()
    return {"deployment": root / "deployment.json", "da": root / "da",
            "receipts": [("0x" + e.signed.digest.hex()) for _, es in batches for e in es],
            "batches": ["0x" + bid.hex() for bid in (
                ops.batches.batch_id(operator.address, m.root) for m, _ in batches)],
            "operator": operator.address, "challenged": opened,
            "ciphertexts": [str(e.ciphertext) for _, es in batches for e in es[:1]],
            "populate_batches_s": populate_batches_s,
            "populate_challenges_s": time.monotonic() - t1}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--receipts", type=int, default=10_000)
    ap.add_argument("--batch-size", type=int, default=100)
    ap.add_argument("--challenges", type=int, default=500)
    ap.add_argument("--requests", type=int, default=600, help="page requests measured")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="vi-bench-explorer-"))
    rnd = random.Random(args.seed)
    with Anvil() as anvil:
        w3 = anvil.web3()
        pop = populate(w3, root, args.receipts, args.batch_size, args.challenges)
        head = w3.eth.block_number
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        log = (root / "explorer.log").open("wb")
        t0 = time.monotonic()
        proc = subprocess.Popen(
            [sys.executable, "-m", "verinfer", "explorer", "--rpc-url", anvil.url,
             "--deployment", str(pop["deployment"]), "--da-store", str(pop["da"]),
             "--model-names", str(root / "models.json"), "--port", str(port)],
            stdout=log, stderr=log, env={**os.environ})
        try:
            with httpx.Client(timeout=30, trust_env=False) as http:
                totals: dict[str, Any] = {}
                while time.monotonic() - t0 < 600:
                    try:
                        st = http.get(url + "/api/status").json()
                        if st["indexed_block"] >= head:
                            totals = http.get(url + "/api/overview").json()["totals"]
                            if totals["receipts"] == args.receipts and all(
                                    b["manifest"] == "ok" for b in http.get(
                                        url + "/api/batches").json()["batches"]):
                                break
                    except httpx.HTTPError:
                        pass
                    time.sleep(0.2)
                index_s = time.monotonic() - t0
                assert totals.get("challenges") == args.challenges, totals
                pages = _page_mix(pop, rnd, args.requests)
                times: dict[str, list[float]] = {}
                for kind, path, want in pages:
                    t = time.perf_counter()
                    r = http.get(url + path)
                    ms = (time.perf_counter() - t) * 1000
                    assert r.status_code == want, (path, r.status_code, r.text[:300])
                    times.setdefault(kind, []).append(ms)
        finally:
            proc.terminate()
            proc.wait(timeout=20)
    every = sorted(x for v in times.values() for x in v)
    out = {"receipts": args.receipts, "batches": len(pop["batches"]),
           "challenges": args.challenges, "blocks": head,
           "populate_batches_s": round(pop["populate_batches_s"], 1),
           "populate_challenges_s": round(pop["populate_challenges_s"], 1),
           "index_s": round(index_s, 1), "requests": len(every),
           "p50_page_ms": round(statistics.median(every), 1),
           "p95_page_ms": round(_p95(every), 1), "max_page_ms": round(every[-1], 1),
           "by_page": {k: {"n": len(v), "p50_ms": round(statistics.median(v), 1),
                           "p95_ms": round(_p95(sorted(v)), 1)} for k, v in times.items()}}
    print(json.dumps(out))


def _p95(xs: list[float]) -> float:
    return xs[min(len(xs) - 1, int(0.95 * len(xs)))]


def _page_mix(pop: dict[str, Any], rnd: random.Random, n: int) -> list[tuple[str, str, int]]:
    """What a watcher clicks, shuffled: every kind of page and its /api twin."""
    kinds: list[tuple[str, Any]] = [
        ("overview", lambda: "/"),
        ("operator", lambda: f"/operator/{pop['operator']}"),
        ("batch", lambda: f"/batch/{rnd.choice(pop['batches'])}"),
        ("receipt", lambda: f"/receipt/{rnd.choice(pop['receipts'])}"),
        ("challenge", lambda: f"/challenge/{rnd.randint(1, len(pop['challenged']))}"),
        ("challenges", lambda: f"/challenges?page={rnd.randint(1, 5)}"),
        ("search", lambda: f"/api/search?q={rnd.choice(pop['receipts'])}"),
        ("api_receipt", lambda: f"/api/receipt/{rnd.choice(pop['receipts'])}"),
        ("api_overview", lambda: "/api/overview"),
        ("not_found", lambda: "/receipt/0x" + rnd.randbytes(32).hex()),
        ("receipts", lambda: f"/receipts?page={rnd.randint(1, 100)}"),
        ("receipts_filtered", lambda: rnd.choice([
            f"/receipts?operator={pop['operator']}&page={rnd.randint(1, 100)}",
            f"/receipts?model={MODEL_NAME}&status=challengeable",
            f"/receipts?status=challenged&operator={pop['operator']}",
            f"/receipts?model=0x{MODEL_ID.hex()}&status=slashed"])),
        ("operators", lambda: "/operators?status=active"),
        ("models", lambda: rnd.choice(["/models", "/models?q=bench"])),
        ("search_model", lambda: "/api/search?q=" + rnd.choice([MODEL_NAME, "BENCH-MODEL"])),
        ("api_receipts", lambda: f"/api/receipts?page={rnd.randint(1, 100)}"),
    ]
    out = []
    for i in range(n):
        kind, make = kinds[i % len(kinds)]
        out.append((kind, make(), 404 if kind == "not_found" else 200))
    rnd.shuffle(out)
    return out


if __name__ == "__main__":
    main()
