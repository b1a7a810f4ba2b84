"""deploy/compose and deploy/k8s, validated offline (issue 17): Debian's docker-compose
(`config -q`) and kubernetes-validate --strict (ships its schemas), plus the pinning rules the
validators do not know: every workload runs the one image BY DIGEST, and the digest the pod
hands to the engine (downward API) is that same digest.

The validators come from scripts/ci-extras.d/10-image-tools; without them these tests skip.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from verinfer.engine import container

REPO = Path(__file__).resolve().parents[2]
COMPOSE = REPO / "deploy" / "compose" / "docker-compose.yml"
K8S = REPO / "deploy" / "k8s"
INSTALL = "run scripts/ci-extras.d/10-image-tools"
PINNED = re.compile(r"^[^@\s]+@(sha256:[0-9a-f]{64})$")
DIGEST = "sha256:" + "ab" * 32
ANNOTATION = "verinfer.dev/image-digest"


def _kubernetes_validate() -> list[str]:
    exe = Path(sys.executable).with_name("kubernetes-validate")
    if not exe.exists():
        pytest.skip(f"kubernetes-validate is not installed: {INSTALL}")
    return [str(exe), "--strict", "--quiet"]


def _compose(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    if shutil.which("docker-compose") is None:
        pytest.skip(f"docker-compose is not installed: {INSTALL}")
    return subprocess.run(["docker-compose", "-f", str(COMPOSE), *args], capture_output=True,
                          text=True, timeout=120, env=env)


def _k8s_docs() -> list[tuple[Path, dict[str, Any]]]:
    out = []
    for f in sorted(K8S.glob("*.yaml")):
        if f.name == "kustomization.yaml":
            continue
        out += [(f, d) for d in yaml.safe_load_all(f.read_text()) if d]
    return out


def _pod_templates() -> list[tuple[str, dict[str, Any]]]:
    return [(f"{d['kind']}/{d['metadata']['name']}", d["spec"]["template"])
            for _, d in _k8s_docs() if d["kind"] in ("Deployment", "StatefulSet")]


# ---- compose ------------------------------------------------------------------------------
def test_compose_validates_offline_with_a_pinned_image() -> None:
    env = {k: v for k, v in os.environ.items() if k != "VERINFER_IMAGE"}
    ok = _compose("config", "-q", env={**env, "VERINFER_IMAGE": f"localhost/verinfer@{DIGEST}"})
    assert ok.returncode == 0, ok.stderr
    resolved = yaml.safe_load(_compose("config", env={
        **env, "VERINFER_IMAGE": f"localhost/verinfer@{DIGEST}"}).stdout)
    services = resolved["services"]
    assert {"anvil", "redis", "setup", "operator", *(f"kms-{i}" for i in range(1, 6)),
            *(f"verifier-{i}" for i in range(4))} <= set(services)
    assert {s["image"] for s in services.values()} == {f"localhost/verinfer@{DIGEST}"}
    # without the digest the file refuses to resolve: nobody deploys an unpinned image
    missing = _compose("config", "-q", env=env)
    assert missing.returncode != 0 and "VERINFER_IMAGE" in missing.stderr


# ---- kubernetes ---------------------------------------------------------------------------
def test_k8s_manifests_pass_kubernetes_validate_strict() -> None:
    files = [str(f) for f in sorted(K8S.glob("*.yaml")) if f.name != "kustomization.yaml"]
    r = subprocess.run([*_kubernetes_validate(), *files], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr


def test_kubernetes_validate_strict_rejects_an_unknown_field(tmp_path: Path) -> None:
    """The validator really validates (a typo in a probe is not silently dropped)."""
    doc = yaml.safe_load((K8S / "namespace.yaml").read_text())
    doc["metadata"]["labelz"] = {"x": "y"}
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(doc))
    r = subprocess.run([*_kubernetes_validate(), str(bad)], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode != 0


def test_kustomization_lists_every_manifest() -> None:
    kust = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    listed = set(kust["resources"])
    assert listed == {f.name for f in K8S.glob("*.yaml") if f.name != "kustomization.yaml"}


def pin_problems(name: str, template: dict[str, Any], engine: bool = True) -> list[str]:
    """Why ``template`` does not run one image by digest and (``engine``: a verinfer process
    runs in it) hand that digest to the engine."""
    problems = []
    spec = template["spec"]
    annotated = template.get("metadata", {}).get("annotations", {}).get(ANNOTATION)
    for c in spec.get("initContainers", []) + spec["containers"]:
        m = PINNED.match(c["image"])
        if m is None:
            problems.append(f"{name}/{c['name']}: image {c['image']} is not pinned by digest")
        elif m.group(1) != annotated:
            problems.append(f"{name}/{c['name']}: image digest {m.group(1)} is not the "
                            f"{ANNOTATION} annotation {annotated}")
    if not engine:
        return problems
    podinfo = [v for v in spec.get("volumes", []) if "downwardAPI" in v]
    items = [i for v in podinfo for i in v["downwardAPI"]["items"]]
    if not any(i["path"] == container.K8S_DIGEST_FILE.name and i["fieldRef"]["fieldPath"]
               == f"metadata.annotations['{ANNOTATION}']" for i in items):
        problems.append(f"{name}: no downward-API item {container.K8S_DIGEST_FILE.name}")
    for c in spec["containers"]:
        mounts = {m["name"]: m["mountPath"] for m in c.get("volumeMounts", [])}
        if str(container.K8S_DIGEST_FILE.parent) not in [mounts.get(v["name"]) for v in podinfo]:
            problems.append(f"{name}/{c['name']}: the image digest is not mounted at "
                            f"{container.K8S_DIGEST_FILE.parent}")
    return problems


def test_every_workload_runs_the_one_image_by_digest_and_sees_it() -> None:
    templates = _pod_templates()
    assert {n for n, _ in templates} == {"Deployment/operator", "Deployment/redis",
                                         "StatefulSet/kms-shard", "StatefulSet/verifier"}
    for name, t in templates:  # redis runs redis-server from the image: no engine in it
        assert pin_problems(name, t, engine=name != "Deployment/redis") == [], name
    images = {c["image"] for _, t in templates for c in t["spec"]["containers"]}
    assert len(images) == 1


def test_pin_check_catches_a_tag_and_a_mismatched_annotation() -> None:
    _, t = next(x for x in _pod_templates() if x[0] == "Deployment/operator")
    tagged = yaml.safe_load(yaml.safe_dump(t))
    tagged["spec"]["containers"][0]["image"] = "localhost/verinfer:latest"
    assert any("not pinned" in p for p in pin_problems("op", tagged))
    other = yaml.safe_load(yaml.safe_dump(t))
    other["metadata"]["annotations"][ANNOTATION] = "sha256:" + "cd" * 32
    assert any("annotation" in p for p in pin_problems("op", other))


def test_probes_and_disruption_budgets() -> None:
    docs = {f"{d['kind']}/{d['metadata']['name']}": d for _, d in _k8s_docs()}
    op = docs["Deployment/operator"]["spec"]["template"]["spec"]["containers"][0]
    assert op["livenessProbe"]["httpGet"]["path"] == "/health"
    assert op["readinessProbe"]["httpGet"]["path"] == "/ready"  # 503 while it may not sign
    kms = docs["StatefulSet/kms-shard"]["spec"]["template"]["spec"]["containers"][0]
    assert {kms["readinessProbe"]["httpGet"]["path"],
            kms["livenessProbe"]["httpGet"]["path"]} == {"/health", "/metrics"}
    assert docs["StatefulSet/kms-shard"]["spec"]["replicas"] == 5
    assert docs["PodDisruptionBudget/kms-shard"]["spec"]["minAvailable"] == 3  # threshold
    for w in ("operator", "redis", "kms-shard", "verifier"):
        assert f"PodDisruptionBudget/{w}" in docs
    secrets = {n for n in docs if n.startswith("Secret/")}
    assert {"Secret/operator-keystore", "Secret/kms-shard-keys",
            "Secret/verifier-keystores"} <= secrets
