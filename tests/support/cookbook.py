"""The auditor's devnet (one per test session, shared by tests/e2e/test_reproduce*.py and
tests/e2e/test_cookbook.py) and the cookbook's code-block extractor.

The devnet is the real `verinfer devnet up` (anvil, contracts, 5 KMS shards, the operator's
`verinfer serve`, one verifier). On it: honest answers through the official openai SDK
(greedy chat, seeded completion, streamed chat), and — signed with the devnet operator's key
and published through its DA store and BatchRegistry — cheats and attacks (tampered output,
wrong seed declared and hidden, withheld ciphertext, a bomb for a ciphertext, a bomb for a
request body). Each receipt is saved as a JSON file an auditor
could have been handed.

The app key: the devnet's KMS keeps every sealed share and every seal key in one tree
(``provision(..., unsafe_single_tree=True)``), so the epoch secret can be rebuilt from t
shares — which no real deployment allows — and handed to the auditor as "the app key"
(``verinfer.devnet.app_key``, the same as `verinfer devnet app-key`).

Why an extractor of our own rather than pytest-markdown-docs or pytest-examples: both run
Python blocks only (the cookbook is mostly shell), neither runs blocks in document order with
shell and Python interleaved against state a session fixture provides, and this is 60 lines
with no dependency to pin. The rules are in docs/cookbook.md ("How this page is tested").
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from openai import OpenAI

from verinfer.devnet.app_key import unsafe_devnet_app_key

ROOT = Path(__file__).resolve().parents[2]
VI = [sys.executable, "-m", "verinfer"]
#: ~190 KB of brackets: what killed parsers before the bounded parser
BOMB = b"[" * 95_000 + b"]" * 95_000


# ---- the devnet -------------------------------------------------------------------------------
@dataclass
class AuditNet:
    dir: Path
    work: Path  # where receipts, keys and the cookbook's files live
    devnet: Any  # verinfer.devnet.harness.Devnet
    model: Path
    app_key: Path
    served_model: str
    #: name -> JSON file an auditor holds (API response, verification object, signed receipt)
    refs: dict[str, Path] = field(default_factory=dict)
    ids: dict[str, str] = field(default_factory=dict)  # name -> receipt id
    #: name -> what the auditor must find: step of the first wrong token, the right token
    expected: dict[str, Any] = field(default_factory=dict)
    requests: dict[str, dict[str, Any]] = field(default_factory=dict)  # bodies the SDK sent

    @property
    def deployment(self) -> Path:
        return self.dir / "deployment.json"

    @property
    def da_store(self) -> str:
        return str(self.devnet.state["da_store"])

    def chain_args(self) -> list[str]:
        return ["--rpc-url", self.devnet.rpc_url, "--deployment", str(self.deployment),
                "--da-store", self.da_store]

    def env(self) -> dict[str, str]:
        """The variables docs/cookbook.md's blocks read (stated at its top)."""
        return {
            "RPC_URL": self.devnet.rpc_url, "DEPLOYMENT": str(self.deployment),
            "DA_STORE": self.da_store, "OPERATOR_URL": self.devnet.operator_url,
            "MODEL_FILE": str(self.model), "APP_KEY": str(self.app_key),
            "SERVED_MODEL": self.served_model,
            "RECEIPT_ID": self.ids["greedy"], "RESPONSE_FILE": str(self.refs["greedy"]),
            "TAMPERED_RECEIPT": str(self.refs["tampered"]),
            "CHALLENGER_KEY": self.devnet.funded_account().key.hex(),
            "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        }


_NET: AuditNet | None = None


def audit_net(config: pytest.Config) -> AuditNet:
    """The session's devnet with its receipts, started on first use, stopped at session end.
    Its directory is its own (not pytest's basetemp, which a concurrent pytest session may
    prune while this one runs, orphaning the devnet's processes)."""
    global _NET
    if _NET is None:
        base = Path(tempfile.mkdtemp(prefix="verinfer-auditnet-"))
        _NET = _start(base)

        def down() -> None:
            subprocess.run([*VI, "devnet", "down", "--dir", str(base / "net")], timeout=60,
                           check=False, capture_output=True)
            shutil.rmtree(base, ignore_errors=True)

        config.add_cleanup(down)
    return _NET


def _start(base: Path) -> AuditNet:
    from verinfer.devnet.harness import Devnet
    from verinfer.verifier.errors import ReceiptRefError

    d = base / "net"
    up = subprocess.run([*VI, "devnet", "up", "--dir", str(d), "--verifiers", "1"],
                        capture_output=True, text=True, timeout=300)
    if up.returncode != 0:
        subprocess.run([*VI, "devnet", "down", "--dir", str(d)], timeout=60, check=False)
        shutil.rmtree(base, ignore_errors=True)
        raise RuntimeError(f"devnet up failed: {up.stderr[-3000:]}")
    try:
        dn = Devnet(d)
        work = base / "work"
        work.mkdir()
        key = unsafe_devnet_app_key(Path(dn.state["kms"]["root"]), work / "app-key.json")
        client = OpenAI(base_url=dn.operator_url + "/v1", api_key="unused", max_retries=0,
                        timeout=120)
        net = AuditNet(d, work, dn, Path(dn.state["model"]), key,
                       client.models.list().data[0].id)
        _honest(net, client)
        _cheats(net)
        for name in ("greedy", "seeded", "streamed", "tampered", "hidden_wrong_seed",
                     "declared_wrong_seed", "bomb_ciphertext", "bomb_request_body"):
            try:
                batch = dn.wait_located(net.ids[name], timeout_s=240).batch
            except ReceiptRefError:
                batch = None
            if batch is None:
                raise RuntimeError(f"receipt {name} was not committed within 240 s; operator "
                                   "log: " + (d / "logs" / "operator.log").read_text()[-3000:])
        return net
    except BaseException:
        subprocess.run([*VI, "devnet", "down", "--dir", str(d)], timeout=60, check=False)
        shutil.rmtree(base, ignore_errors=True)  # the error carries what the logs said
        raise


def _save(net: AuditNet, name: str, doc: dict[str, Any], receipt_id: str) -> None:
    path = net.work / f"{name}.json"
    path.write_text(json.dumps(doc, indent=1))
    net.refs[name], net.ids[name] = path, receipt_id


def _honest(net: AuditNet, client: OpenAI) -> None:
    """Through the operator's real API with the openai SDK, as a client would."""
    m = net.served_model
    greedy: dict[str, Any] = {"model": m, "temperature": 0, "max_tokens": 12, "messages": [
        {"role": "user", "content": "Why do lighthouses blink?"}]}
    doc = client.chat.completions.create(**greedy).model_dump()
    _save(net, "greedy", doc, doc["verification"]["receipt_id"])
    seeded: dict[str, Any] = {"model": m, "prompt": "The keeper of the light", "seed": 7,
                              "max_tokens": 12}
    doc = client.completions.create(**seeded).model_dump()
    _save(net, "seeded", doc, doc["verification"]["receipt_id"])
    net.requests.update(greedy=greedy, seeded=seeded)
    last: Any = None
    for chunk in client.chat.completions.create(
            model=m, seed=11, max_tokens=12, stream=True,
            messages=[{"role": "user", "content": "Stream a story about a tide."}]):
        last = chunk
    v = dict((last.model_extra or {})["verification"])  # the final chunk carries it
    _save(net, "streamed", v, v["receipt_id"])


def _cheats(net: AuditNet) -> None:
    """Dishonest evidence, signed with the devnet operator's key (testing/evidence.py's
    unsafe_ producers), published like the operator's own batches."""
    from verinfer.receipts.canonical import ExecResult
    from verinfer.testing.evidence import chat_body, request_for_body
    from verinfer.verifier.reexec import engine_for

    dn = net.devnet
    engine = engine_for(net.model)
    f = dn.unsafe_operator_factory(engine)

    def body(tag: str, seed: int) -> bytes:
        return chat_body(f"auditor case {tag}", max_tokens=8, seed=seed)

    evs = {"tampered": f.unsafe_tampered_tokens(body("tampered", 21)),
           "hidden_wrong_seed": f.unsafe_hidden_wrong_seed(body("hidden seed", 22), 998),
           "declared_wrong_seed": f.unsafe_wrong_seed(body("declared seed", 23), 999)}
    req = request_for_body(engine, body("bomb body", 24))
    gen = engine.generate(list(req.prompt_token_ids), req.sampling_params())
    evs["bomb_request_body"] = f._finish(BOMB, req, ExecResult.from_generation(gen), gen.text)
    req = request_for_body(engine, body("bomb blob", 25))
    gen = engine.generate(list(req.prompt_token_ids), req.sampling_params())
    evs["bomb_ciphertext"] = f._finish(body("bomb blob", 25), req,
                                       ExecResult.from_generation(gen), gen.text, blob=BOMB)
    withheld = f.honest(body("withheld", 26))
    dn.unsafe_publish_as_operator([*evs.values(), withheld], withheld=[withheld])
    evs["withheld"] = withheld
    for name, ev in evs.items():
        _save(net, name, ev.signed.to_json(), "0x" + ev.digest.hex())
    # where an honest engine's answer parts from each claim (claims read back from their
    # envelopes with the app key: the factory keeps no result)
    from verinfer.auditor.material import load_app_key
    from verinfer.receipts.envelope import open_envelope

    key = load_app_key(net.app_key).key
    for name in ("tampered", "hidden_wrong_seed", "declared_wrong_seed"):
        ev = evs[name]
        claimed = open_envelope(ev.blob, ev.signed.receipt, key).result.output_token_ids
        honest = request_for_body(engine, ev.request_body)
        right = engine.generate(list(honest.prompt_token_ids), honest.sampling_params())
        k = next(i for i in range(min(len(right.token_ids), len(claimed)))
                 if right.token_ids[i] != claimed[i])
        net.expected[name] = (k, right.token_ids[k], claimed[k])


# ---- the cookbook's blocks ------------------------------------------------------------------
_FENCE = re.compile(r"^```([^\n`]*)\n(.*?)^```[ \t]*$", re.S | re.M)


@dataclass(frozen=True)
class Block:
    lang: str  # sh | python
    code: str
    line: int  # 1-based line of the opening fence
    run: bool  # false: "```sh no-run" (shown, not executed)


def code_blocks(markdown: str) -> list[Block]:
    """The ```sh and ```python blocks, in document order; an info string ``<lang> no-run``
    marks one that is shown but not executed (installation, starting a devnet)."""
    out = []
    for m in _FENCE.finditer(markdown):
        info = m.group(1).split()
        if info and info[0] in ("sh", "python"):
            out.append(Block(info[0], m.group(2), markdown.count("\n", 0, m.start()) + 1,
                             "no-run" not in info[1:]))
    return out


def run_block(block: Block, cwd: Path, env: dict[str, str], ns: dict[str, Any]) -> str:
    """Runs one block: shell with ``bash -euo pipefail`` in ``cwd`` under ``env``; Python in
    this process in ``ns`` (shared by the page's Python blocks, like one notebook). Returns
    the output; raises AssertionError naming the block's line on failure."""
    if block.lang == "sh":
        p = subprocess.run(["bash", "-euo", "pipefail", "-c", block.code], cwd=cwd,
                           env={**os.environ, **env}, capture_output=True, text=True,
                           timeout=300)
        out = p.stdout + p.stderr
        assert p.returncode == 0, f"docs/cookbook.md:{block.line}: exit {p.returncode}\n{out}"
        return out
    old_env, old_cwd = dict(os.environ), Path.cwd()
    os.environ.update(env)
    os.chdir(cwd)
    try:
        # padded so a traceback's line numbers are the page's
        exec(compile("\n" * block.line + block.code, "docs/cookbook.md", "exec"), ns)
    finally:
        os.chdir(old_cwd)
        os.environ.clear()
        os.environ.update(old_env)
    return ""

