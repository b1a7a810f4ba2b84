"""The reproducible image (issue 17): build time, size, digest stability, container start.

    .venv/bin/python bench/image.py [--model gemma3-270m] [--keep]

Builds the image twice with scripts/build-image from a fresh clone of this checkout's HEAD
(a live working tree may change between the builds; each build assembles the image from
scratch; downloaded .debs are cached), then runs the operator from it by digest
(podman, host network, an `operator init --unsafe-dev` directory mounted) and times
`podman run` until /health answers. Last line: one JSON object with build_s (first build),
rebuild_s (second), image_mb, digest_stable (1 when the two digests are equal),
container_start_to_ready_s, and the digest. Needs root, podman, buildah, mmdebstrap
(scripts/ci-extras.d/10-image-tools).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from verinfer.ports import free_port

REPO = Path(__file__).resolve().parents[1]
CONF = {"CONTAINERS_CONF": str(REPO / "deploy" / "containers.conf")}
TAG = "localhost/verinfer-bench"


def build(src: Path, tag: str) -> tuple[str, float]:
    t0 = time.perf_counter()
    r = subprocess.run([str(src / "scripts" / "build-image"), "--tag", tag],
                       capture_output=True, text=True,
                       env={**os.environ, **CONF, "VERINFER_BUILD_PYTHON": sys.executable,
                            "VERINFER_CONTRACTS_DIR": str(REPO / "contracts")})
    if r.returncode != 0:
        sys.exit(f"build-image failed:\n{r.stderr[-3000:]}")
    return r.stdout.strip().splitlines()[-1], time.perf_counter() - t0


def podman(*args: str, check: bool = True) -> str:
    r = subprocess.run(["podman", *args], capture_output=True, text=True,
                       env={**os.environ, **CONF})
    if check and r.returncode != 0:
        sys.exit(f"podman {args[0]} failed: {r.stderr[-2000:]}")
    return r.stdout.strip()


def start_to_ready(digest: str, model: str, work: Path) -> float:
    op = work / "op"
    subprocess.run([sys.executable, "-m", "verinfer", "operator", "init", str(op),
                    "--unsafe-dev", "--light-kdf"], check=True, capture_output=True)
    port, name = free_port(), f"verinfer-bench-{os.getpid()}"
    t0 = time.perf_counter()
    podman("run", "-d", "--rm", "--privileged", "--name", name, "--network", "host",
           "-v", f"{work}:{work}", f"{TAG}@{digest}", "serve", "--model", model,
           "--host", "127.0.0.1", "--port", str(port), "--operator-dir", str(op), "--unsafe-dev")
    try:
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as r:
                    if r.status == 200:
                        return time.perf_counter() - t0
            except OSError:
                pass
            if "running" not in podman("inspect", "-f", "{{.State.Status}}", name, check=False):
                sys.exit("the operator container exited: " + podman("logs", name, check=False))
            if time.perf_counter() - t0 > 600:
                sys.exit("the operator container was not ready within 600 s")
            time.sleep(0.2)
    finally:
        podman("rm", "-f", "-t", "5", name, check=False)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="gemma3-270m", help="model the operator serves")
    ap.add_argument("--keep", action="store_true", help="keep the images afterwards")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="verinfer-bench-image-") as d:
        src = Path(d) / "src"
        subprocess.run(["git", "clone", "-q", "--no-hardlinks", str(REPO), str(src)],
                       check=True)
        first, build_s = build(src, f"{TAG}:1")
        second, rebuild_s = build(src, f"{TAG}:2")
        size = int(podman("image", "inspect", "--format", "{{.Size}}", f"{TAG}:1"))
        ready_s = start_to_ready(first, a.model, Path(d))
    if not a.keep and first == second:  # differing images stay, to be compared
        podman("rmi", "-f", f"{TAG}:1", f"{TAG}:2", check=False)
    print(json.dumps({"build_s": round(build_s, 1), "rebuild_s": round(rebuild_s, 1),
                      "image_mb": round(size / 1e6, 1), "digest_stable": int(first == second),
                      "container_start_to_ready_s": round(ready_s, 2), "digest": first,
                      "model": a.model, "cpus": os.cpu_count(),
                      "load_avg_1m": round(os.getloadavg()[0], 1)}))


if __name__ == "__main__":
    main()
