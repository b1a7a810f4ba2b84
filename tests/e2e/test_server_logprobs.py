"""Logprobs through the real server (issue 14 item 6): what the client reads is bit for bit what
the receipt commits (ExecResult.logprobs under outHash), and the real verifier job, given the
published ciphertext and the epoch key, judges the receipt reproduced — for chat and legacy
completions, whole and streamed."""

from __future__ import annotations

import copy
import struct
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from openai import OpenAI

from verinfer.da_client.errors import BlobNotFoundError
from verinfer.da_client.local import LocalDAClient
from verinfer.da_client.pointer import Pointer
from verinfer.kms.app_keys import app_keypair, seed_from_secret
from verinfer.kms.epochs import FileEpochRegistry
from verinfer.kms.keygen import shard_dir, share_label, share_path
from verinfer.kms.local_cluster import ClusterLayout
from verinfer.kms.sealing import load_seal_key, read_sealed
from verinfer.kms.shamir import Share, reconstruct
from verinfer.protocol.exec_request import ExecRequest
from verinfer.receipts.canonical import ExecResult
from verinfer.receipts.epoch_keys import EpochPrivateKey
from verinfer.receipts.logprobs_check import (
    LogprobsMismatchError,
    check_chat_logprobs,
    check_completion_logprobs,
)
from verinfer.verifier.reexec import verify_receipt_job

CHAT: dict[str, Any] = {"model": "tiny",
                        "messages": [{"role": "user", "content": "how sure are you?"}]}


def _bits(x: float) -> int:
    return int.from_bytes(struct.pack(">d", x), "big")


def _v(r: Any) -> dict[str, Any]:
    out: dict[str, Any] = (r.model_extra or {})["verification"]
    return out


@pytest.fixture(scope="module")
def epoch_key(operator_dir: Path) -> EpochPrivateKey:
    """The epoch private key, as t KMS shards would release it into a verifier's enclave:
    `operator init --unsafe-dev` keeps the whole 2-of-3 dev KMS (seal keys and sealed shares)
    in one tree, so the test reconstructs the secret from two shares directly."""
    lay = ClusterLayout(operator_dir / "kms", 3)
    rec = FileEpochRegistry(lay.registry).get(1)
    shares = [Share(i, int.from_bytes(read_sealed(share_path(shard_dir(lay.root, i), 1),
                                                  load_seal_key(lay.seal_key_file(i)),
                                                  share_label(1, i)), "big"))
              for i in (1, 2)]
    sk, pk = app_keypair(seed_from_secret(reconstruct(shares, rec.threshold)), rec.suite)
    assert "0x" + pk.to_bytes().hex() == rec.public_key
    return sk


def _blob(operator_dir: Path, pointer: str) -> bytes:
    da = LocalDAClient(str(operator_dir / "da"))
    deadline = time.monotonic() + 60
    while True:  # the publisher uploads off the response path
        try:
            return da.get(Pointer.parse(pointer))
        except BlobNotFoundError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def _judged_reproduced(v: dict[str, Any], operator_dir: Path, tiny_path: Path,
                       sk: EpochPrivateKey) -> None:
    out = verify_receipt_job(sk, receipt=v["receipt"]["message"],
                             blob=_blob(operator_dir, v["da_pointer"]),
                             model_path=str(tiny_path))
    assert out["reason"] == "match" and out["agrees"] is True, out
    assert out["vote"] == v["out_hash"]


def _committed(v: dict[str, Any], top: int) -> list[tuple[float, list[float]]]:
    req = ExecRequest.from_json(v["exec_request"])
    res = ExecResult.from_json(v["exec_result"])
    assert req.top_logprobs == top and "0x" + req.hash.hex() == v["req_hash"]
    assert "0x" + res.hash.hex() == v["out_hash"]  # the logprobs are under the signed outHash
    assert res.logprobs is not None and len(res.logprobs) == len(res.output_token_ids)
    return [(lp, [x for _, x in alts]) for lp, alts in res.logprobs]


def _same_bits(shown: list[tuple[float, list[float]]],
               committed: list[tuple[float, list[float]]]) -> None:
    assert [(_bits(a), [_bits(x) for x in b]) for a, b in shown] == \
        [(_bits(a), [_bits(x) for x in b]) for a, b in committed]


@pytest.fixture()
def client(server: str) -> Iterator[OpenAI]:
    yield OpenAI(base_url=server + "/v1", api_key="unused", max_retries=0)


def test_chat_logprobs_are_committed_and_reproduced(client: OpenAI, operator_dir: Path,
                                                    tiny_path: Path,
                                                    epoch_key: EpochPrivateKey) -> None:
    r = client.chat.completions.create(**CHAT, max_tokens=7, temperature=0.8, seed=5,
                                       logprobs=True, top_logprobs=4)
    content = r.choices[0].logprobs.content if r.choices[0].logprobs else None
    assert content
    shown = [(t.logprob, [a.logprob for a in t.top_logprobs]) for t in content]
    _same_bits(shown, _committed(_v(r), 4))
    check_chat_logprobs([t.model_dump() for t in content],
                        ExecResult.from_json(_v(r)["exec_result"]))
    _judged_reproduced(_v(r), operator_dir, tiny_path, epoch_key)


def test_chat_stream_logprobs_are_committed_and_reproduced(client: OpenAI, operator_dir: Path,
                                                           tiny_path: Path,
                                                           epoch_key: EpochPrivateKey) -> None:
    chunks = list(client.chat.completions.create(**CHAT, max_tokens=6, temperature=0,
                                                 logprobs=True, top_logprobs=2, stream=True))
    shown = [(t.logprob, [a.logprob for a in t.top_logprobs])
             for c in chunks if c.choices and c.choices[0].logprobs
             for t in (c.choices[0].logprobs.content or [])]
    v = _v(chunks[-1])
    _same_bits(shown, _committed(v, 2))
    _judged_reproduced(v, operator_dir, tiny_path, epoch_key)


def test_chat_logprobs_without_alternatives(client: OpenAI, operator_dir: Path,
                                            tiny_path: Path, epoch_key: EpochPrivateKey) -> None:
    r = client.chat.completions.create(**CHAT, max_tokens=4, temperature=1.2, seed=9,
                                       logprobs=True)
    content = r.choices[0].logprobs.content if r.choices[0].logprobs else None
    assert content and all(t.top_logprobs == [] for t in content)
    _same_bits([(t.logprob, []) for t in content], _committed(_v(r), 0))
    _judged_reproduced(_v(r), operator_dir, tiny_path, epoch_key)


def test_completions_logprobs_are_committed_and_reproduced(client: OpenAI, operator_dir: Path,
                                                           tiny_path: Path,
                                                           epoch_key: EpochPrivateKey) -> None:
    r = client.completions.create(model="tiny", prompt="once upon a", max_tokens=6,
                                  temperature=0.7, seed=21, logprobs=3)
    lp = r.choices[0].logprobs
    assert lp is not None and lp.token_logprobs and lp.top_logprobs
    committed = _committed(_v(r), 3)
    assert [_bits(x) for x in lp.token_logprobs] == [_bits(a) for a, _ in committed]
    for shown, (_, alts) in zip(lp.top_logprobs, committed, strict=True):
        # the legacy shape keys alternatives by token text (two ids can share one): every value
        # shown is a committed one, best first as committed
        assert [_bits(x) for x in shown.values()] == [_bits(x) for x in alts][:len(shown)] \
            or {_bits(x) for x in shown.values()} <= {_bits(x) for x in alts}
    _judged_reproduced(_v(r), operator_dir, tiny_path, epoch_key)


def test_completions_stream_logprobs_are_committed_and_reproduced(
        client: OpenAI, operator_dir: Path, tiny_path: Path,
        epoch_key: EpochPrivateKey) -> None:
    chunks = list(client.completions.create(model="tiny", prompt="the end", max_tokens=5,
                                            temperature=0, logprobs=1, stream=True))
    shown = [x for c in chunks if c.choices and c.choices[0].logprobs
             for x in (c.choices[0].logprobs.token_logprobs or [])]
    v = _v(chunks[-1])
    assert [_bits(x) for x in shown] == [_bits(a) for a, _ in _committed(v, 1)]
    _judged_reproduced(v, operator_dir, tiny_path, epoch_key)


def test_no_logprobs_asked_none_committed(client: OpenAI) -> None:
    r = client.chat.completions.create(**CHAT, max_tokens=3, temperature=0)
    assert r.choices[0].logprobs is None
    v = _v(r)
    assert ExecRequest.from_json(v["exec_request"]).top_logprobs is None
    assert ExecResult.from_json(v["exec_result"]).logprobs is None


# ---- the client's side: shown == committed ------------------------------------------------------
def _post(server: str, path: str, body: dict[str, Any]) -> dict[str, Any]:
    r = httpx.post(f"{server}/v1/{path}", json=body, timeout=60)
    assert r.status_code == 200, r.text
    out: dict[str, Any] = r.json()
    return out


def _nudge(x: float) -> float:
    (w,) = struct.unpack(">Q", struct.pack(">d", x))
    return float(struct.unpack(">d", struct.pack(">Q", w ^ 1))[0])


def test_client_check_catches_chat_logprobs_shown_other_than_committed(server: str) -> None:
    body = {**CHAT, "max_tokens": 5, "temperature": 0.9, "seed": 4, "logprobs": True,
            "top_logprobs": 3}
    r = _post(server, "chat/completions", body)
    res = ExecResult.from_json(r["verification"]["exec_result"])
    content = r["choices"][0]["logprobs"]["content"]
    check_chat_logprobs(content, res)  # the honest server: shown == committed
    # what an operator (or a proxy) that "improves" the numbers it shows would send
    for tamper in ("chosen", "alternative", "drop_alternative", "drop_all"):
        shown = copy.deepcopy(content)
        if tamper == "chosen":
            shown[1]["logprob"] = _nudge(shown[1]["logprob"])
        elif tamper == "alternative":
            shown[-1]["top_logprobs"][2]["logprob"] = -0.001
        elif tamper == "drop_alternative":
            shown[0]["top_logprobs"].pop()
        with pytest.raises(LogprobsMismatchError):
            check_chat_logprobs(None if tamper == "drop_all" else shown, res)


def test_client_check_catches_completion_logprobs_shown_other_than_committed(
        server: str) -> None:
    body = {"model": "tiny", "prompt": "a b c", "max_tokens": 5, "temperature": 0.9,
            "seed": 8, "logprobs": 2}
    r = _post(server, "completions", body)
    res = ExecResult.from_json(r["verification"]["exec_result"])
    lp = r["choices"][0]["logprobs"]
    check_completion_logprobs(lp, res)
    shown = copy.deepcopy(lp)
    shown["token_logprobs"][0] = _nudge(shown["token_logprobs"][0])
    with pytest.raises(LogprobsMismatchError):
        check_completion_logprobs(shown, res)
    shown = copy.deepcopy(lp)
    key = next(iter(shown["top_logprobs"][2]))
    shown["top_logprobs"][2][key] = -1e-9
    with pytest.raises(LogprobsMismatchError):
        check_completion_logprobs(shown, res)
    # logprobs shown for a response whose receipt commits none
    r = _post(server, "completions", {**body, "logprobs": None})
    with pytest.raises(LogprobsMismatchError):
        check_completion_logprobs(lp, ExecResult.from_json(r["verification"]["exec_result"]))
