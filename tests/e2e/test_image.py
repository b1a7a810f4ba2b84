"""Issue 17: the reproducible image, built for real and run.

* `scripts/build-image` in two fresh clones of this commit gives ONE manifest digest; a third
  clone with one source byte changed gives another. The three builds run at once (each
  assembles its image from scratch; only downloaded .debs are shared), once per session.
* The operator runs from the image (podman, started by digest, operator directory made by
  `verinfer operator init` on the host and mounted): `/v1/models` and a chat completion
  through the openai SDK; the receipt's signature recovers (eth-account) to the operator, and
  its engineFingerprintHash is the hash of a fingerprint that names the printed digest — the
  digest podman told the process, not one anybody typed.

Needs root, podman, buildah and mmdebstrap: scripts/ci-extras.d/10-image-tools installs them.
"""

from __future__ import annotations

import hashlib
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

import httpx
import pytest
from eth_account import Account
from eth_account.messages import encode_typed_data
from openai import OpenAI

from support.servers import operator_init
from verinfer.engine.fingerprint import EngineFingerprint
from verinfer.ports import free_port

REPO = Path(__file__).resolve().parents[2]
INSTALL = "run scripts/ci-extras.d/10-image-tools"
CONTAINERS_CONF = REPO / "deploy" / "containers.conf"
DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")
TAG = "localhost/verinfer-test"
CHANGED_FILE = "src/verinfer/engine/container.py"


def _missing_tools() -> str | None:
    if os.geteuid() != 0:
        return "the image build needs root (mmdebstrap --mode=root, buildah mount)"
    missing = [t for t in ("podman", "buildah", "mmdebstrap", "git") if shutil.which(t) is None]
    if missing:
        return f"{', '.join(missing)} missing: {INSTALL}"
    if not (REPO / "contracts" / "out").is_dir():
        return "contracts/out missing: run scripts/bootstrap-contracts"
    return None


@dataclass(frozen=True)
class Builds:
    a: str  # digest of clone A (this commit)
    b: str  # digest of clone B (this commit)
    changed: str  # digest of clone C (one byte changed)
    seconds: float


def _env() -> dict[str, str]:
    return {**os.environ, "CONTAINERS_CONF": str(CONTAINERS_CONF),
            "VERINFER_BUILD_PYTHON": sys.executable,
            "VERINFER_CONTRACTS_DIR": str(REPO / "contracts")}


def _clone(dest: Path) -> Path:
    subprocess.run(["git", "clone", "-q", "--no-hardlinks", str(REPO), str(dest)], check=True,
                   timeout=120)
    return dest


def podman(*args: str, timeout: float = 120, check: bool = True
           ) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["podman", *args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "CONTAINERS_CONF": str(CONTAINERS_CONF)},
                          check=check)


@pytest.fixture(scope="session")
def builds(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Builds]:
    why = _missing_tools()
    if why:
        pytest.skip(why)
    root = tmp_path_factory.mktemp("image-builds")
    clones = {k: _clone(root / k) for k in ("a", "b", "c")}
    changed = clones["c"] / CHANGED_FILE
    text = changed.read_text()
    assert "runtime that started the process" in text
    changed.write_text(text.replace("runtime that started the process",
                                    "runtime that started the Process", 1))  # one byte
    t0 = time.monotonic()
    procs = {k: subprocess.Popen([str(c / "scripts" / "build-image"), "--tag", f"{TAG}:{k}"],
                                 stdout=subprocess.PIPE, stderr=(root / f"{k}.log").open("w"),
                                 text=True, env=_env())
             for k, c in clones.items()}
    out = {}
    for k, p in procs.items():
        stdout, _ = p.communicate(timeout=1500)
        log = (root / f"{k}.log").read_text()
        assert p.returncode == 0, f"build {k} failed:\n{log[-4000:]}"
        out[k] = stdout.strip().splitlines()[-1]
        assert DIGEST.match(out[k]), stdout
    ids = {podman("image", "inspect", "--format", "{{.ID}}", f"{TAG}:{k}").stdout.strip()
           for k in clones}
    yield Builds(out["a"], out["b"], out["c"], time.monotonic() - t0)
    podman("rmi", "-f", *ids, check=False)  # by id: removing the tags alone may leave them


def test_two_builds_of_one_commit_give_one_digest(builds: Builds) -> None:
    assert builds.a == builds.b, "two builds of one commit differ: not reproducible"


def test_one_changed_source_byte_changes_the_digest(builds: Builds) -> None:
    assert builds.changed != builds.a


def test_the_image_records_the_debian_set_it_holds(builds: Builds) -> None:
    """docs/deploy.md: the lock may drift (a warning), the image states what it holds."""
    ref = f"{TAG}@{builds.a}"
    recorded = podman("run", "--rm", "--entrypoint", "/bin/cat", ref,
                      "/opt/verinfer/debian.lock").stdout
    held = podman("run", "--rm", "--entrypoint", "/usr/bin/dpkg-query", ref, "-W",
                  "-f=${Package}=${Version}\\n").stdout
    assert recorded.splitlines() == sorted(held.splitlines())
    assert any(line.startswith("python3.11=") for line in recorded.splitlines())


@pytest.fixture(scope="session")
def operator_container(builds: Builds, tiny_path: Path,
                       tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The operator from the image, started BY DIGEST, on a loopback port (host network)."""
    d = tmp_path_factory.mktemp("image-operator")
    op = d / "op"
    operator_init(op)  # on the host; mounted at the same path (operator.json holds paths)
    shutil.copy(tiny_path, d / "tiny.gguf")
    port = free_port()
    ref = f"{TAG}@{builds.a}"
    name = f"verinfer-test-operator-{os.getpid()}"
    # --privileged: podman 4 states the image in /run/.containerenv only to such containers
    podman("run", "-d", "--rm", "--privileged", "--name", name, "--network", "host",
           "-v", f"{d}:{d}", ref, "serve", "--model", str(d / "tiny.gguf"), "--name", "tiny",
           "--host", "127.0.0.1", "--port", str(port), "--max-context", "512",
           "--operator-dir", str(op), "--unsafe-dev", timeout=120)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 300
        while True:
            try:
                if httpx.get(base + "/health", timeout=5).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            state = podman("inspect", "-f", "{{.State.Status}}", name, check=False)
            assert state.returncode == 0 and "running" in state.stdout, \
                podman("logs", name, check=False).stderr[-3000:]
            assert time.monotonic() < deadline, podman("logs", name, check=False).stderr[-3000:]
            time.sleep(1)
        yield base
    finally:
        podman("rm", "-f", "-t", "5", name, check=False)


def test_operator_container_signs_under_the_printed_digest(builds: Builds,
                                                           operator_container: str) -> None:
    client = OpenAI(base_url=operator_container + "/v1", api_key="unused", max_retries=2,
                    timeout=120)
    assert [m.id for m in client.models.list().data] == ["tiny"]
    r = client.chat.completions.create(model="tiny", max_tokens=4, temperature=0,
                                       messages=[{"role": "user", "content": "hello image"}])
    assert r.choices[0].message.content is not None
    v = dict((r.model_extra or {})["verification"])
    signer = Account.recover_message(encode_typed_data(full_message=v["receipt"]),
                                     signature=v["signature"])
    assert signer == v["operator"]
    health = httpx.get(operator_container + "/health", timeout=30).json()
    approved = health["engine_fingerprint"]["approved"]
    # the fingerprint names the digest build-image printed, read from podman's containerenv
    assert approved["container_digest"] == builds.a
    assert health["engine_fingerprint"]["reported"]["container_source"] == "podman"
    canonical = json.dumps(approved, sort_keys=True, separators=(",", ":")).encode()
    assert EngineFingerprint(**approved).canonical() == canonical
    fp_hash = "0x" + hashlib.sha256(canonical).hexdigest()
    assert v["receipt"]["message"]["engineFingerprintHash"] == fp_hash
    # and the operator's receipt record says the same
    rec = httpx.get(f"{operator_container}/v1/receipts/{v['receipt_id']}", timeout=30)
    assert rec.status_code == 200, rec.text
    assert fp_hash in rec.text
