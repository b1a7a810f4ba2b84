"""Every response carries a verification object that a client checks with eth-account alone
and recomputes from its own request and response; the evidence reaches DA and a batch."""

from __future__ import annotations

import hashlib
import time
from pathlib import Path
from typing import Any

import httpx
from eth_account import Account
from eth_account.messages import encode_typed_data
from openai import OpenAI

from verinfer.da_client.local import LocalDAClient
from verinfer.da_client.pointer import Pointer
from verinfer.protocol.exec_request import ExecRequest
from verinfer.receipts.canonical import ExecResult
from verinfer.receipts.merkle import MerkleProof, verify_proof

CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "tell me a story"}]}


def _v(r: Any) -> dict[str, Any]:
    return (r.model_extra or {})["verification"]  # type: ignore[no-any-return]


def test_signature_recovers_the_operator_with_eth_account_alone(client: OpenAI) -> None:
    r = client.chat.completions.create(**CHAT, max_tokens=8, temperature=0.7, seed=11)
    v = _v(r)
    typed = v["receipt"]
    assert typed["primaryType"] == "Receipt" and typed["domain"]["name"] == "verinfer"
    signer = Account.recover_message(encode_typed_data(full_message=typed),
                                     signature=v["signature"])
    assert signer == v["operator"] == typed["message"]["operator"]
    assert typed["message"]["reqHash"] == v["req_hash"]
    assert typed["message"]["outHash"] == v["out_hash"]
    assert v["seed"] == 11 and v["da_pointer"].startswith("da://local/0x")


def test_hashes_recompute_from_the_clients_request_and_response(client: OpenAI) -> None:
    r = client.chat.completions.create(**CHAT, max_tokens=10, temperature=0.9, seed=3,
                                       top_p=0.8)
    v, choice = _v(r), r.choices[0]
    ev = (choice.model_extra or {})["verinfer"]
    # The result: rebuilt from what the client received.
    res = ExecResult(output_token_ids=tuple(ev["output_token_ids"]),
                     finish_reason=choice.finish_reason,
                     logit_digest=bytes.fromhex(ev["logit_digest"][2:]),
                     text_sha256=hashlib.sha256((choice.message.content or "").encode()).digest())
    assert "0x" + res.hash.hex() == v["out_hash"]
    # The request: the operator's ExecRequest, checked against what the client asked for.
    req = ExecRequest.from_json(v["exec_request"])
    assert "0x" + req.hash.hex() == v["req_hash"]
    assert (req.seed, req.temperature, req.top_p, req.max_tokens) == (3, 0.9, 0.8, 10)
    assert list(req.prompt_token_ids) == ev["prompt_token_ids"]
    assert "0x" + req.model_id.hex() == ev["model_id"]
    assert "0x" + hashlib.sha256(req.engine_fingerprint.encode()).hexdigest() == \
        ev["engine_fingerprint"]


def test_streamed_receipt_covers_the_streamed_bytes(client: OpenAI) -> None:
    whole = client.chat.completions.create(**CHAT, max_tokens=12, temperature=0)
    chunks = list(client.chat.completions.create(**CHAT, max_tokens=12, temperature=0,
                                                 stream=True))
    last = chunks[-1]
    assert last.choices == []
    v = _v(last)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    res = ExecResult.from_json(v["exec_result"])
    assert res.text_sha256 == hashlib.sha256(text.encode()).digest()
    # Same execution as the non-streamed request: same request and output hashes.
    assert (v["req_hash"], v["out_hash"]) == (_v(whole)["req_hash"], _v(whole)["out_hash"])
    assert v["receipt_id"] != _v(whole)["receipt_id"]  # but its own receipt (issued anew)


def test_every_choice_has_its_own_receipt(client: OpenAI) -> None:
    r = client.chat.completions.create(**CHAT, max_tokens=6, temperature=1.0, seed=2, n=2)
    v = _v(r)
    assert len(v["choices"]) == 2 and v["choices"][0]["receipt_id"] == v["receipt_id"]
    assert len({c["receipt_id"] for c in v["choices"]}) == 2


def test_completions_carry_verification(client: OpenAI) -> None:
    r = client.completions.create(model="tiny", prompt="once upon", max_tokens=5,
                                  temperature=0)
    v = _v(r)
    assert Account.recover_message(encode_typed_data(full_message=v["receipt"]),
                                   signature=v["signature"]) == v["operator"]


def test_receipt_is_published_batched_and_provable(server: str, client: OpenAI,
                                                   operator_dir: Path) -> None:
    r = client.chat.completions.create(**CHAT, max_tokens=4, temperature=0)
    rid = _v(r)["receipt_id"]
    deadline = time.monotonic() + 60
    while True:
        st = httpx.get(f"{server}/v1/receipts/{rid}").json()
        if st["state"] == "committed" or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert st["state"] == "committed", st
    assert st["receipt"] == _v(r)["receipt"] and st["da_pointer"] == _v(r)["da_pointer"]
    b = st["batch"]
    proof = MerkleProof(b["proof"]["index"], tuple(bytes.fromhex(s[2:])
                                                   for s in b["proof"]["siblings"]),
                        b["proof"]["leaf_count"])
    assert verify_proof(bytes.fromhex(rid[2:]), proof, bytes.fromhex(b["root"][2:]))
    # The ciphertext is on the local DA under its content address, as the receipt names it.
    blob = LocalDAClient(str(operator_dir / "da")).get(Pointer.parse(st["da_pointer"]))
    assert "0x" + hashlib.sha256(blob).hexdigest() == st["receipt"]["message"]["ciphertextHash"]


def test_unknown_and_malformed_receipt_ids(server: str) -> None:
    r = httpx.get(f"{server}/v1/receipts/0x" + "ab" * 32)
    assert r.status_code == 404 and r.json()["error"]["code"] == "receipt_not_found"
    r = httpx.get(f"{server}/v1/receipts/nonsense")
    assert r.status_code == 400 and r.json()["error"]["param"] == "receipt_id"
