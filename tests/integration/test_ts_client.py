"""The TypeScript verifier (packages/verinfer-verify) computes the one request rule Python does:
the shared vectors (tests/vectors/exec_requests.json) are what scripts/gen-client-vectors writes
from the Python codec today, `npm test` in the package equals them all, and its CLI calls a real
answer of a staked operator (anvil + `verinfer serve`) valid and a tampered one invalid, naming
the check. Needs node >= 20 and the package's npm dependencies (scripts/ci-extras.d/50-npm-verify);
skips, naming what is missing, without them."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from support.servers import operator_init, running_server
from support.tool_template import QWEN25_TOOLS_TEMPLATE
from verinfer.engine.tiny import write_tiny_llama
from verinfer.testing.client_chain import ClientChain, client_chain

pytestmark = [pytest.mark.process]  # node, npm, the generator; the real answer: + anvil, loopback

ROOT = Path(__file__).resolve().parents[2]
PKG = ROOT / "packages" / "verinfer-verify"
VECTORS = ROOT / "tests" / "vectors" / "exec_requests.json"
GEN = ROOT / "scripts" / "gen-client-vectors"


def _node_or_skip() -> str:
    node = shutil.which("node")
    if node is None:
        pytest.skip("node (>= 20) is not installed: the TypeScript verifier cannot be tested")
    if not (PKG / "node_modules" / "viem").is_dir():
        pytest.skip("the TypeScript verifier's npm dependencies are missing: run "
                    "scripts/ci-extras.d/50-npm-verify")
    return node


def _run(*cmd: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, cwd=PKG, capture_output=True, text=True, timeout=timeout)


def test_the_shared_vectors_are_what_python_writes() -> None:
    r = subprocess.run([sys.executable, str(GEN), "--check"], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    data = json.loads(VECTORS.read_text(encoding="utf-8"))
    reqs = data["exec_requests"]
    assert len(reqs) >= 200
    maps = [v["json"] for v in reqs]
    assert any("logit_bias" in m for m in maps) and any("grammar_spec" in m for m in maps)
    assert any("presence_penalty" in m for m in maps) and any(m["stop"] for m in maps)
    assert any(m["seed"] == 2**64 - 1 for m in maps)
    assert any(len(m["prompt_token_ids"]) >= 3000 for m in maps)
    assert len(data["exec_results"]) >= 20 and len(data["receipts"]) >= 20


def test_npm_test_equals_python_on_every_vector() -> None:
    _node_or_skip()
    r = _run("npm", "test")
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
    passed = re.search(r"^# pass (\d+)$", r.stdout, re.M)
    assert "# fail 0" in r.stdout and passed and int(passed[1]) >= 14, r.stdout[-2000:]


# ---- a real answer -----------------------------------------------------------------------------
@dataclass
class Net:
    chain: ClientChain
    base: str
    model_id: str
    node: str

    def verify(self, tmp: Path, body: bytes, response: bytes, *extra: str
               ) -> subprocess.CompletedProcess[str]:
        (tmp / "req.json").write_bytes(body)
        (tmp / "resp.json").write_bytes(response)
        return _run(self.node, "dist/src/cli.js", str(tmp / "req.json"), str(tmp / "resp.json"),
                    "--chain-id", str(self.chain.deployment.chain_id),
                    "--contract", self.chain.deployment.challenge_manager,
                    "--operator", self.chain.operator.address,
                    "--model", f"tiny={self.model_id}", *extra, timeout=60)


@pytest.fixture(scope="module")
def net(tmp_path_factory: pytest.TempPathFactory, tiny_path: Path) -> Iterator[Net]:
    node = _node_or_skip()
    build = _run("npm", "run", "build")
    assert build.returncode == 0, build.stdout + build.stderr
    tmp = tmp_path_factory.mktemp("tsclient")
    with client_chain(tmp) as chain, pytest.MonkeyPatch.context() as mp:
        mp.setenv("OPERATOR_KEY", chain.operator.key.hex())
        operator_init(tmp / "op", "--private-key-env", "OPERATOR_KEY", "--rpc-url",
                      chain.node.url, "--deployment", str(chain.deployment_file))
        with running_server(tiny_path, "--operator-dir", str(tmp / "op"),
                            env=dict(os.environ)) as base:
            health = httpx.get(base + "/health").json()
            chain.approve(bytes.fromhex(health["model_id"][2:]),
                          bytes.fromhex(health["engine_fingerprint"]["hash"][2:]))
            deadline = time.monotonic() + 60
            while not httpx.get(base + "/health").json()["ready"]:
                assert time.monotonic() < deadline, httpx.get(base + "/health").json()
                time.sleep(0.2)
            yield Net(chain, base, health["model_id"], node)


def _post(net: Net, path: str, body: dict[str, Any]) -> tuple[bytes, bytes]:
    raw = json.dumps(body).encode()
    r = httpx.post(net.base + path, content=raw, timeout=60,
                   headers={"content-type": "application/json", "authorization": "Bearer x"})
    assert r.status_code == 200, r.text
    return raw, r.content


CHAT: dict[str, Any] = {"model": "tiny", "max_tokens": 6, "temperature": 0.7, "seed": 2**64 - 2,
                        "stop": ["\n\n"], "messages": [{"role": "user",
                                                        "content": "tell me about the sea ✓"}]}


@pytest.mark.anvil
@pytest.mark.process
@pytest.mark.loopback
def test_node_calls_a_real_answer_valid_and_a_tampered_one_invalid(net: Net,
                                                                   tmp_path: Path) -> None:
    body, resp = _post(net, "/v1/chat/completions", CHAT)
    ok = net.verify(tmp_path, body, resp)
    assert ok.returncode == 0 and ok.stdout.startswith("valid"), ok.stdout + ok.stderr

    answer = json.loads(resp)
    text = answer["choices"][0]["message"]["content"]
    tampered = {**answer, "choices": [{**answer["choices"][0],
                                       "message": {**answer["choices"][0]["message"],
                                                   "content": text + " (edited)"}}]}
    bad = net.verify(tmp_path, body, json.dumps(tampered).encode())
    assert bad.returncode == 1 and bad.stdout.startswith("invalid: output"), bad.stdout

    # the body the app sent asked for another temperature than the one signed
    other = json.dumps({**CHAT, "temperature": 0.8}).encode()
    bad = net.verify(tmp_path, other, resp)
    assert bad.returncode == 1 and "invalid: request" in bad.stdout and "temperature" in \
        bad.stdout, bad.stdout
    # another seed: choice 0's seed is the body's
    bad = net.verify(tmp_path, json.dumps({**CHAT, "seed": 2**64 - 1}).encode(), resp)
    assert bad.returncode == 1 and "seed" in bad.stdout, bad.stdout

    # a signed field changed: the signature no longer recovers the operator
    v = answer["verification"]
    msg = v["receipt"]["message"]
    forged = {**answer, "verification": {**v, "receipt": {**v["receipt"], "message": {
        **msg, "issuedAt": msg["issuedAt"] - 1}}}}
    bad = net.verify(tmp_path, body, json.dumps(forged).encode())
    assert bad.returncode == 1 and bad.stdout.startswith("invalid: signature"), bad.stdout

    # the exec_request shown is not the one hashed into reqHash
    req = {**v["exec_request"], "max_tokens": v["exec_request"]["max_tokens"] + 1}
    forged = {**answer, "verification": {**v, "exec_request": req}}
    bad = net.verify(tmp_path, body, json.dumps(forged).encode())
    assert bad.returncode == 1 and bad.stdout.startswith("invalid: request"), bad.stdout

    # another chain, another contract, another operator
    bad = _run(net.node, "dist/src/cli.js", str(tmp_path / "req.json"),
               str(tmp_path / "resp.json"), "--chain-id", "1", "--contract",
               net.chain.deployment.challenge_manager, timeout=60)
    assert bad.returncode == 1 and bad.stdout.startswith("invalid: chain_id"), bad.stdout
    bad = _run(net.node, "dist/src/cli.js", str(tmp_path / "req.json"),
               str(tmp_path / "resp.json"), "--chain-id", "31337", "--contract",
               net.chain.deployment.challenge_manager, "--operator", "0x" + "11" * 20,
               timeout=60)
    assert bad.returncode == 1 and bad.stdout.startswith("invalid: operator"), bad.stdout
    bad = _run(net.node, "dist/src/cli.js", str(tmp_path / "req.json"),
               str(tmp_path / "resp.json"), "--chain-id", "31337", "--contract",
               "0x" + "22" * 20, timeout=60)
    assert bad.returncode == 1 and bad.stdout.startswith("invalid: contract"), bad.stdout


@pytest.mark.anvil
@pytest.mark.process
@pytest.mark.loopback
def test_node_checks_every_choice_and_completions(net: Net, tmp_path: Path) -> None:
    body, resp = _post(net, "/v1/chat/completions", {**CHAT, "n": 2, "seed": 9,
                                                     "presence_penalty": 0.5,
                                                     "logit_bias": {"5": 2, "3": -1.5}})
    ok = net.verify(tmp_path, body, resp)
    assert ok.returncode == 0 and "valid 2 choice" in ok.stdout, ok.stdout + ok.stderr
    body, resp = _post(net, "/v1/completions", {"model": "tiny", "prompt": "The keeper of the",
                                                "max_tokens": 5, "seed": 7, "logprobs": 2})
    ok = net.verify(tmp_path, body, resp)
    assert ok.returncode == 0 and ok.stdout.startswith("valid"), ok.stdout + ok.stderr
    answer = json.loads(resp)
    assert answer["verification"]["exec_request"]["top_logprobs"] == 2
    answer["choices"][0]["finish_reason"] = ("stop" if answer["choices"][0]["finish_reason"]
                                             == "length" else "length")
    bad = net.verify(tmp_path, body, json.dumps(answer).encode())
    assert bad.returncode == 1 and bad.stdout.startswith("invalid: output"), bad.stdout


# ---- a real tool-call answer (the tiny model with a tool-capable chat template) ----------------
@pytest.fixture(scope="module")
def tools_net(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Net]:
    node = _node_or_skip()
    build = _run("npm", "run", "build")
    assert build.returncode == 0, build.stdout + build.stderr
    tmp = tmp_path_factory.mktemp("tsclient-tools")
    model = write_tiny_llama(tmp / "tiny-tools.gguf", seed=0,
                             chat_template=QWEN25_TOOLS_TEMPLATE)
    with client_chain(tmp) as chain, pytest.MonkeyPatch.context() as mp:
        mp.setenv("OPERATOR_KEY", chain.operator.key.hex())
        operator_init(tmp / "op", "--private-key-env", "OPERATOR_KEY", "--rpc-url",
                      chain.node.url, "--deployment", str(chain.deployment_file))
        with running_server(model, "--operator-dir", str(tmp / "op"), "--max-context", "2048",
                            env=dict(os.environ)) as base:
            health = httpx.get(base + "/health").json()
            chain.approve(bytes.fromhex(health["model_id"][2:]),
                          bytes.fromhex(health["engine_fingerprint"]["hash"][2:]))
            deadline = time.monotonic() + 60
            while not httpx.get(base + "/health").json()["ready"]:
                assert time.monotonic() < deadline, httpx.get(base + "/health").json()
                time.sleep(0.2)
            yield Net(chain, base, health["model_id"], node)


ADD: dict[str, Any] = {"type": "function", "function": {"name": "add", "parameters": {
    "type": "object", "properties": {"b": {"type": "integer", "minimum": 0, "maximum": 99},
                                     "a": {"type": "integer", "minimum": 0, "maximum": 99}},
    "required": ["a", "b"], "additionalProperties": False}}}


@pytest.mark.anvil
@pytest.mark.process
@pytest.mark.loopback
def test_node_checks_a_real_tool_call_answer(tools_net: Net, tmp_path: Path) -> None:
    """A forced call (its grammar spec derived from the body's tools, key order included) and
    its message re-derived from verinfer.output_text: valid; a tampered call: invalid, naming
    the check."""
    for choice in ("required", {"type": "function", "function": {"name": "add"}}):
        body, resp = _post(tools_net, "/v1/chat/completions", {
            "model": "tiny", "messages": [{"role": "user", "content": "add 2 and 3"}],
            "tools": [ADD], "tool_choice": choice, "max_tokens": 60, "seed": 21})
        answer = json.loads(resp)
        c = answer["choices"][0]
        assert c["finish_reason"] == "tool_calls" and c["message"]["tool_calls"], c
        ok = tools_net.verify(tmp_path, body, resp)
        assert ok.returncode == 0 and ok.stdout.startswith("valid"), ok.stdout + ok.stderr

        fn = c["message"]["tool_calls"][0]["function"]
        fn["arguments"] = json.dumps({**json.loads(fn["arguments"]), "a": 100})
        bad = tools_net.verify(tmp_path, body, json.dumps(answer).encode())
        assert bad.returncode == 1 and bad.stdout.startswith("invalid: tool_calls"), bad.stdout
    c["message"]["tool_calls"] = json.loads(resp)["choices"][0]["message"]["tool_calls"]
    c["message"]["content"] = "Adding."
    bad = tools_net.verify(tmp_path, body, json.dumps(answer).encode())
    assert bad.returncode == 1 and bad.stdout.startswith("invalid: content"), bad.stdout
    # the named call's answer checked against a body that asked for 'required': the signed
    # grammar is not the one the body's tools give
    required = json.dumps({**json.loads(body), "tool_choice": "required"}).encode()
    bad = tools_net.verify(tmp_path, required, resp)
    assert bad.returncode == 1 and "invalid: request" in bad.stdout and "grammar_spec" in \
        bad.stdout, bad.stdout
