"""`verinfer reproduce` on one shared `verinfer devnet up` (tests/support/cookbook.py):

- honest greedy, seeded and streamed answers (the openai SDK against the operator's API) are
  reproduced, from each reference form an auditor holds (the response file, the verification
  object, the receipt id at the operator's /v1/receipts, the receipt id in the chain's batches);
- tampered tokens and a wrong seed (declared in the ExecRequest, or hidden) give "mismatch at
  step k" with the step and token an honest engine computes, and the `verinfer challenge`
  command that escalates;
- a withheld ciphertext, a wrong app key and an absent model file give "cannot reproduce";
- a transcript saved with the app key reproduces without any key; a transcript of another
  exchange does not pass for this receipt;
- a fresh `verinfer reproduce` process per kernel ISA path (scalar, AVX2, AVX-512 where the CPU
  has it) reproduces the same receipt bit for bit; a path the CPU lacks is refused;
- an unreachable chain is "cannot reproduce"; the fingerprint rules say which difference
  matters. The operator's attacks on the auditor: test_reproduce_attacks.py.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from support.cookbook import VI, AuditNet, audit_net
from verinfer.auditor.material import AppKey, load_app_key, load_transcript
from verinfer.auditor.report import Report
from verinfer.auditor.reproduce import AuditConfig, Auditor, ChainAccess
from verinfer.da_client.local import LocalDAClient
from verinfer.devnet.network import bind


@pytest.fixture(scope="module")
def net(request: pytest.FixtureRequest) -> AuditNet:
    return audit_net(request.config)


def _auditor(net: AuditNet, *, key: AppKey | bool | None = True, chain: bool = True,
             models: list[str] | None = None, **cfg: Any) -> Auditor:
    dn = net.devnet
    access = (ChainAccess(dn.view, bind(dn.w3, dn.deployment), dn.rpc_url, net.deployment)
              if chain else None)
    app_key = load_app_key(net.app_key) if key is True else (key or None)
    return Auditor(AuditConfig(models=[str(net.model)] if models is None else models,
                               app_key=app_key, da_args=["--da-store", net.da_store],
                               da_backends=["local"], **cfg),
                   chain=access, da=LocalDAClient(net.da_store))


def _statuses(report: Report) -> dict[str, str]:
    return {s.name: s.status for s in report.steps}


@pytest.mark.parametrize("name", ["greedy", "seeded", "streamed"])
def test_honest_answers_are_reproduced(net: AuditNet, name: str) -> None:
    report = _auditor(net).run(str(net.refs[name]))
    assert report.verdict.outcome == "reproduced", report.to_json()
    assert report.receipt_id == net.ids[name]
    assert _statuses(report) == dict.fromkeys(
        ["signature", "batch", "ciphertext", "open", "environment", "replay"], "ok")
    replay = report.step("replay")
    assert replay is not None and replay.data["decoded_tokens"] == 0  # one pass sufficed
    assert replay.data["replayed_steps"] == len(replay.data["tokens"]) > 0
    assert report.challenge_command is None


def test_every_reference_form_reproduces(net: AuditNet, tmp_path: Path) -> None:
    doc = json.loads(net.refs["greedy"].read_text())
    verification = tmp_path / "verification.json"
    verification.write_text(json.dumps(doc["verification"]))
    by_operator = _auditor(net, operator_url=net.devnet.operator_url).run(net.ids["greedy"])
    by_chain = _auditor(net).run(net.ids["greedy"])
    by_file = _auditor(net).run(str(verification))
    ptr = by_file.step("ciphertext")
    assert ptr is not None
    by_pointer = _auditor(net).run(ptr.data["pointer"])
    for how, report in {"operator": by_operator, "chain": by_chain, "file": by_file,
                        "pointer": by_pointer}.items():
        assert report.verdict.outcome == "reproduced", (how, report.to_json())
        assert report.receipt_id == net.ids["greedy"], how
    sig = by_operator.step("signature")
    assert sig is not None and "operator" in sig.data["source"]


@pytest.mark.parametrize("name", ["tampered", "hidden_wrong_seed", "declared_wrong_seed"])
def test_cheats_mismatch_at_the_first_wrong_step(net: AuditNet, name: str) -> None:
    report = _auditor(net).run(str(net.refs[name]))
    k, right, claimed = net.expected[name]
    v = report.verdict
    assert (v.outcome, v.step, v.token, v.claimed_token) == ("mismatch", k, right, claimed), \
        report.to_json()
    assert v.text().startswith(f"mismatch at step {k}: ")
    if name == "declared_wrong_seed":  # the request rule catches it before any replay
        assert "not what the request body asks for" in v.reason and "seed" in v.reason
    assert report.challenge_command == (
        f"verinfer challenge {net.ids[name]} --rpc-url {net.devnet.rpc_url} --deployment "
        f"{net.deployment} --da-store {net.da_store}")


def test_withheld_ciphertext_cannot_be_reproduced(net: AuditNet) -> None:
    report = _auditor(net).run(str(net.refs["withheld"]))
    assert report.verdict.outcome == "cannot_reproduce", report.to_json()
    assert "not on the DA layer" in report.verdict.reason
    assert _statuses(report)["batch"] == "warn"  # unbatched, said plainly
    batch = report.step("batch")
    assert batch is not None and "unbatched" in batch.detail


def test_wrong_app_key_cannot_reproduce(net: AuditNet, tmp_path: Path) -> None:
    from verinfer.auditor.material import write_app_key

    other = tmp_path / "other-key.json"
    key = load_app_key(net.app_key)
    write_app_key(other, key.key.suite.value, (12345).to_bytes(32, "big"), None)
    with_chain = _auditor(net, key=load_app_key(other)).run(str(net.refs["greedy"]))
    assert with_chain.verdict.outcome == "cannot_reproduce"
    assert "not key epoch 1's" in with_chain.verdict.reason
    without_chain = _auditor(net, key=load_app_key(other), chain=False).run(
        str(net.refs["greedy"]))
    assert without_chain.verdict.outcome == "cannot_reproduce"
    assert "does not open with this app key" in without_chain.verdict.reason
    no_key = _auditor(net, key=None).run(str(net.refs["greedy"]))
    assert no_key.verdict.outcome == "cannot_reproduce"
    assert "--app-key" in no_key.verdict.reason


def test_absent_model_file_cannot_reproduce(net: AuditNet, tmp_path: Path) -> None:
    from verinfer.engine.tiny import write_tiny_llama

    other = write_tiny_llama(tmp_path / "other-weights.gguf", seed=1)
    for models in ([], [str(other)], [str(tmp_path / "missing.gguf")]):
        report = _auditor(net, models=models).run(str(net.refs["greedy"]))
        assert report.verdict.outcome == "cannot_reproduce", models
        assert report.verdict.reason.startswith("model 0x") and "is absent" in \
            report.verdict.reason, report.verdict.reason


def test_transcript_reproduces_without_a_key(net: AuditNet, tmp_path: Path) -> None:
    saved = tmp_path / "transcript.json"
    first = _auditor(net, save_transcript=saved).run(str(net.refs["seeded"]))
    assert first.verdict.outcome == "reproduced"
    transcript = load_transcript(saved)
    # a journalist: the receipt and the transcript, no key, no DA, no chain
    report = Auditor(AuditConfig(models=[str(net.model)], transcript=transcript)).run(
        str(net.refs["seeded"]))
    assert report.verdict.outcome == "reproduced", report.to_json()
    assert _statuses(report)["ciphertext"] == "skip"
    other = Auditor(AuditConfig(models=[str(net.model)], transcript=transcript)).run(
        str(net.refs["streamed"]))
    assert other.verdict.outcome == "cannot_reproduce"
    assert "does not hash to the receipt's reqHash and outHash" in other.verdict.reason


@pytest.mark.parametrize("name", ["greedy", "seeded"])
def test_clients_own_transcript_reproduces_without_a_key(net: AuditNet, name: str,
                                                          tmp_path: Path) -> None:
    """The app owner kept its request and the API response: no key, no DA, no chain."""
    response = json.loads(net.refs[name].read_text())
    path = tmp_path / "client.json"

    def run(request: Any, resp: Any) -> Report:
        path.write_text(json.dumps({"request": request, "response": resp}))
        return Auditor(AuditConfig(models=[str(net.model)],
                                   transcript=load_transcript(path))).run(str(net.refs[name]))

    report = run(net.requests[name], response)
    assert report.verdict.outcome == "reproduced", report.to_json()
    other = {**net.requests[name], "max_tokens": 11}
    assert "reqHash" in run(other, response).verdict.reason
    choice = response["choices"][0]
    if "message" in choice:
        choice["message"]["content"] += " (edited)"
    else:
        choice["text"] += " (edited)"
    edited = run(net.requests[name], response)
    assert edited.verdict.outcome == "cannot_reproduce"
    assert "outHash" in edited.verdict.reason


def _cli(net: AuditNet, ref: str, *extra: str, env: dict[str, str] | None = None
         ) -> tuple[int, dict[str, Any], str]:
    p = subprocess.run([*VI, "reproduce", ref, "--model", str(net.model), "--app-key",
                        str(net.app_key), *net.chain_args(), "--json", *extra],
                       capture_output=True, text=True, timeout=300,
                       env={**os.environ, **(env or {})})
    lines = p.stdout.strip().splitlines()
    return p.returncode, json.loads(lines[-1]) if lines else {}, p.stderr


def test_same_receipt_reproduces_bit_for_bit_on_each_kernel_isa(net: AuditNet) -> None:
    """One fresh `verinfer reproduce` process per path this CPU has (run side by side: each is
    mostly start-up), the path forced through VERINFER_KERNEL_ISA."""
    from verinfer.engine import kernels

    isas = kernels.supported_isas()
    assert {"scalar", "avx2"} <= set(isas), isas  # the approved machine class has AVX2
    claimed = json.loads(net.refs["streamed"].read_text())["out_hash"]
    procs = {isa: subprocess.Popen(
        [*VI, "reproduce", str(net.refs["streamed"]), "--model", str(net.model), "--app-key",
         str(net.app_key), *net.chain_args(), "--json"], stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, env={**os.environ, "VERINFER_KERNEL_ISA": isa})
        for isa in isas}
    digests = {}
    for isa, p in procs.items():
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, (isa, err[-3000:])
        res = json.loads(out.strip().splitlines()[-1])
        env_step = next(s for s in res["steps"] if s["step"] == "environment")
        replay = next(s for s in res["steps"] if s["step"] == "replay")
        assert env_step["kernel_isa"] == isa
        assert res["verdict"] == "reproduced" and replay["out_hash"] == claimed, isa
        digests[isa] = replay["logit_digest"]
    assert len(set(digests.values())) == 1, digests


def test_cli_mismatch_exit_code_and_challenge_command(net: AuditNet) -> None:
    rc, out, err = _cli(net, str(net.refs["tampered"]), "--kernel-isa", "scalar")
    assert rc == 1, err[-3000:]
    k, _, _ = net.expected["tampered"]
    assert out["verdict"] == "mismatch" and out["mismatch_step"] == k
    assert out["challenge_command"].startswith(f"verinfer challenge {net.ids['tampered']} ")
    assert out["challenge_command"] in err  # printed for the person too


def test_cli_refuses_a_kernel_path_the_cpu_lacks(net: AuditNet) -> None:
    from verinfer.engine import kernels

    missing = [i for i in ("scalar", "avx2", "avx512") if i not in kernels.supported_isas()]
    if not missing:
        pytest.skip("this CPU runs every kernel path")
    rc, out, _ = _cli(net, str(net.refs["greedy"]), "--kernel-isa", missing[0])
    assert rc == 2 and out["verdict"] == "cannot_reproduce"
    assert f"cannot run the {missing[0]} kernel path" in out["reason"]


def test_unreachable_chain_rpc_is_cannot_reproduce(net: AuditNet) -> None:
    from web3 import Web3

    from verinfer.chain.deploy import Deployment
    from verinfer.ports import free_port
    from verinfer.verifier.chain_view import ChainView

    w3 = Web3(Web3.HTTPProvider(f"http://127.0.0.1:{free_port()}",
                                request_kwargs={"timeout": 2}))
    d = Deployment.load(net.deployment)
    contracts = d.bind(w3)
    auditor = Auditor(AuditConfig(models=[str(net.model)], app_key=load_app_key(net.app_key)),
                      chain=ChainAccess(ChainView(w3, d, contracts), contracts, "http://dead",
                                        net.deployment),
                      da=LocalDAClient(net.da_store))
    report = auditor.run(str(net.refs["greedy"]))
    assert report.verdict.outcome == "cannot_reproduce", report.to_json()
    assert report.verdict.reason.startswith("signature: ")


def test_fingerprint_differences_say_what_matters() -> None:
    from verinfer.auditor.environment import fingerprint_diffs

    base = {"version": 5, "backend": "torch-cpu", "kernels": "invariant", "linear_order": "x",
            "sampler": "vi-sample-v2", "dtype": "float32", "container_digest": "none",
            "hardware_class": "any"}
    assert fingerprint_diffs(json.dumps(base), base) == []
    image = fingerprint_diffs(json.dumps({**base, "container_digest": "sha256:" + "a" * 64}),
                              base)
    assert [(d.field, d.matters) for d in image] == [("container_digest", False)]
    rule = fingerprint_diffs(json.dumps({**base, "sampler": "vi-sample-v1"}), base)
    assert [(d.field, d.matters) for d in rule] == [("sampler", True)]
    fast = {**base, "kernels": "fast", "hardware_class": "cpu:avx2"}
    assert {(d.field, d.matters) for d in fingerprint_diffs(json.dumps(fast), base)} == {
        ("kernels", True), ("hardware_class", True)}
    assert fingerprint_diffs("not json", base)[0].matters
