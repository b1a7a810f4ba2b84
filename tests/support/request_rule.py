"""Shared by the request-rule tests: send a body to a real `verinfer serve`, collect every
choice's receipt, and judge each one with the real verifier job (verify_receipt_job) on the
envelope the operator published to its local DA.

The epoch private key is recovered from the operator directory's locally provisioned KMS tree
(`operator init` without --epochs-file writes seal keys and sealed shares side by side — a test
layout, "unsafe_single_tree"), by the same Shamir reconstruction and key derivation the enclave
runner uses after a KMS release; the committee's key-release protocol is not what is under test.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from verinfer.da_client.errors import BlobNotFoundError
from verinfer.da_client.local import LocalDAClient
from verinfer.da_client.pointer import Pointer
from verinfer.kms.app_keys import app_keypair, seed_from_secret
from verinfer.kms.epochs import FileEpochRegistry
from verinfer.kms.keygen import shard_dir, share_label, share_path
from verinfer.kms.sealing import load_seal_key, read_sealed
from verinfer.kms.shamir import Share, reconstruct
from verinfer.receipts.epoch_keys import EpochPrivateKey
from verinfer.verifier.reexec import verify_receipt_job


def epoch_private_key(operator_dir: Path) -> EpochPrivateKey:
    cfg = json.loads((operator_dir / "operator.json").read_text())
    epoch = int(cfg["key_epoch"])
    root = operator_dir / "kms"
    rec = FileEpochRegistry(root / "epochs.json").get(epoch)
    shares = []
    for i in range(1, rec.threshold + 1):
        key = load_seal_key(root / "seal-keys" / f"shard-{i}.key")
        raw = read_sealed(share_path(shard_dir(root, i), epoch), key, share_label(epoch, i))
        shares.append(Share(i, int.from_bytes(raw, "big")))
    sk, pk = app_keypair(seed_from_secret(reconstruct(shares, rec.threshold)), rec.suite)
    assert pk.to_bytes() == rec.public_key_bytes  # the key the operator sealed to
    return sk


@dataclass
class Served:
    """One accepted request: its body bytes and the verification entry of each choice."""

    body: bytes
    entries: list[dict[str, Any]]


def verification_entries(verification: dict[str, Any]) -> list[dict[str, Any]]:
    return list(verification.get("choices") or [verification])


def post(client: httpx.Client, base: str, body: bytes) -> httpx.Response:
    path = "/v1/chat/completions" if b'"messages"' in body else "/v1/completions"
    return client.post(base + path, content=body,
                       headers={"content-type": "application/json"}, timeout=120)


def served(resp: httpx.Response, body: bytes) -> Served:
    """The receipts of a 200 answer, whole or streamed (the final SSE chunk carries them)."""
    assert resp.status_code == 200, (resp.status_code, resp.text[:500], body[:500])
    if resp.headers["content-type"].startswith("text/event-stream"):
        frames = [f[6:] for f in resp.text.split("\n\n") if f.startswith("data: ")]
        assert frames[-1] == "[DONE]", frames[-1]
        chunks = [json.loads(f) for f in frames[:-1]]
        assert all("error" not in c for c in chunks), chunks[-1]
        verification = chunks[-1]["verification"]
    else:
        verification = resp.json()["verification"]
    return Served(body, verification_entries(verification))


def judge_all(operator_dir: Path, model_path: Path, entries: list[dict[str, Any]],
              *, timeout_s: float = 60.0) -> list[dict[str, Any]]:
    """The verdict of the real verifier job for every receipt, once its envelope is on DA."""
    sk = epoch_private_key(operator_dir)
    da = LocalDAClient(str(operator_dir / "da"))
    deadline = time.monotonic() + timeout_s
    verdicts = []
    for e in entries:
        while True:
            try:
                blob = da.get(Pointer.parse(e["da_pointer"]))
                break
            except BlobNotFoundError:
                assert time.monotonic() < deadline, "the envelope never reached DA"
                time.sleep(0.1)
        verdicts.append(verify_receipt_job(sk, receipt=e["receipt"]["message"], blob=blob,
                                           model_path=str(model_path)))
    return verdicts
