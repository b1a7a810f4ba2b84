"""Issue 17: the reproducible image, built for real and run.

* `scripts/build-image` in two fresh clones of this commit gives ONE manifest digest. The two
  builds run at once (each assembles its image from scratch; only downloaded .debs are shared),
  once per session.
* The digest binds the sources: the image holds every Python file of this commit's
  `src/verinfer` byte for byte (the manifest digest hashes the layer that holds them, so one
  changed source byte changes it). This used to be shown by a third full build with one byte
  changed; reading the files back proves the same binding for a third of the CPU (issue 33: the
  three builds were the suite's longest path).
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
BUILD_TIMEOUT_S = 3000  # two builds at once took 2,241 s beside a loaded suite (load 10-14)


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
    source: Path  # clone A
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
    clones = {k: _clone(root / k) for k in ("a", "b")}
    t0 = time.monotonic()
    procs = {k: subprocess.Popen([str(c / "scripts" / "build-image"), "--tag", f"{TAG}:{k}"],
                                 stdout=subprocess.PIPE, stderr=(root / f"{k}.log").open("w"),
                                 text=True, env=_env())
             for k, c in clones.items()}
    out = {}
    for k, p in procs.items():
        try:
            stdout, _ = p.communicate(timeout=max(60.0, BUILD_TIMEOUT_S
                                                  - (time.monotonic() - t0)))
        except subprocess.TimeoutExpired:
            for q in procs.values():
                q.kill()
            raise AssertionError(f"build {k} ran past {BUILD_TIMEOUT_S} s; its stages:\n"
                                 + _stages(root / f"{k}.log")) from None
        log = (root / f"{k}.log").read_text()
        assert p.returncode == 0, f"build {k} failed:\n{log[-4000:]}"
        out[k] = stdout.strip().splitlines()[-1]
        assert DIGEST.match(out[k]), stdout
    ids = {podman("image", "inspect", "--format", "{{.ID}}", f"{TAG}:{k}").stdout.strip()
           for k in clones}
    print(f"two image builds at once: {time.monotonic() - t0:.0f} s; build a's stages:\n"
          + _stages(root / "a.log"))
    yield Builds(out["a"], out["b"], clones["a"], time.monotonic() - t0)
    podman("rmi", "-f", *ids, check=False)  # by id: removing the tags alone may leave them


def test_two_builds_of_one_commit_give_one_digest(builds: Builds) -> None:
    assert builds.a == builds.b, "two builds of one commit differ: not reproducible"


def _stages(log: Path) -> str:
    """build-image's timed stage lines (``build-image: [12s] wheel``)."""
    return "\n".join(line for line in log.read_text(errors="replace").splitlines()
                     if line.startswith("build-image: ["))


_HASH_PACKAGE = """
import hashlib, json, pathlib, sys
root = pathlib.Path("/usr/local/lib/python3.11/dist-packages/verinfer")
print(json.dumps({str(p.relative_to(root.parent)): hashlib.sha256(p.read_bytes()).hexdigest()
                  for p in sorted(root.rglob("*.py"))}))
"""


def test_the_image_holds_this_commits_sources_byte_for_byte(builds: Builds) -> None:
    """What the digest binds: every ``.py`` of the commit's src/verinfer, and nothing else, is
    in the image with the same bytes, so a changed source byte is a changed layer and so a
    changed manifest digest."""
    ref = f"{TAG}@{builds.a}"
    held = json.loads(podman("run", "--rm", "--entrypoint", "/usr/bin/python3.11", ref, "-c",
                             _HASH_PACKAGE).stdout)
    src = builds.source / "src"
    tracked = subprocess.run(["git", "-C", str(builds.source), "ls-files", "-z", "--",
                              "src/verinfer/*.py"], capture_output=True, check=True,
                             timeout=60).stdout.decode().split("\0")
    expected = {f.removeprefix("src/"): hashlib.sha256((builds.source / f).read_bytes())
                .hexdigest() for f in tracked if f}
    assert len(expected) > 100 and (src / "verinfer" / "__init__.py").is_file()
    missing = sorted(set(expected) - set(held))
    extra = sorted(set(held) - set(expected))
    differ = sorted(f for f in set(expected) & set(held) if expected[f] != held[f])
    assert not (missing or extra or differ), (missing[:5], extra[:5], differ[:5])


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
    ref = f"{TAG}@{builds.a}"
    name = f"verinfer-test-operator-{os.getpid()}"
    try:
        for attempt in range(3):
            port = free_port()  # host network: another process may take it before the operator
            # --privileged: podman 4 states the image in /run/.containerenv only to such containers;
            # no --rm, so that an exited container's log can still be read
            podman("rm", "-f", "-t", "5", name, check=False)
            podman("run", "-d", "--privileged", "--name", name, "--network", "host",
                   "-v", f"{d}:{d}", ref, "serve", "--model", str(d / "tiny.gguf"), "--name",
                   "tiny", "--host", "127.0.0.1", "--port", str(port), "--max-context", "512",
                   "--operator-dir", str(op), "--unsafe-dev", timeout=120)
            base = f"http://127.0.0.1:{port}"
            if _wait_healthy(name, base):
                break
            logs = podman("logs", name, check=False)
            text = (logs.stdout + logs.stderr)[-3000:]
            assert "address already in use" in text and attempt < 2, text
        yield base
    finally:
        podman("rm", "-f", "-t", "5", name, check=False)


def _wait_healthy(name: str, base: str, timeout_s: float = 300.0) -> bool:
    """True once the container's operator answers /health; False if the container exited."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if httpx.get(base + "/health", timeout=5).status_code == 200:
                return True
        except httpx.HTTPError:
            pass
        state = podman("inspect", "-f", "{{.State.Status}}", name, check=False)
        if state.returncode != 0 or "running" not in state.stdout:
            return False
        assert time.monotonic() < deadline, podman("logs", name, check=False).stderr[-3000:]
        time.sleep(1)


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
