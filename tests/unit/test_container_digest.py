"""The running image's digest comes from the container runtime, never from the operator
(engine/container.py), and the fingerprint says `none` when there is no pinned image."""

from __future__ import annotations

from pathlib import Path

import pytest

from verinfer.engine import container
from verinfer.engine.fingerprint import FINGERPRINT_VERSION, engine_fingerprint

DIGEST = "sha256:" + "ab" * 32

# what podman 4.3 writes (Go %q quoting)
PODMAN_PINNED = f'''engine="podman-4.3.1"
name="operator"
id="0123456789abcdef"
image="localhost/verinfer@{DIGEST}"
imageid="{"cd" * 32}"
rootless=0
'''
PODMAN_BY_TAG = PODMAN_PINNED.replace(f"@{DIGEST}", ":latest")


@pytest.fixture
def runtime_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    env, k8s = tmp_path / "containerenv", tmp_path / "podinfo" / "image-digest"
    monkeypatch.setattr(container, "CONTAINERENV", env)
    monkeypatch.setattr(container, "K8S_DIGEST_FILE", k8s)
    return env, k8s


def test_outside_a_container_the_fingerprint_says_none(runtime_files: tuple[Path, Path]) -> None:
    ident = container.running_image()
    assert ident.digest == container.NO_CONTAINER and "not in a container" in ident.source
    fp = engine_fingerprint("invariant", "avx2", "order")
    assert fp.container_digest == "none" and fp.version == FINGERPRINT_VERSION == 5
    assert b'"container_digest":"none"' in fp.canonical()


def test_podman_started_by_digest_names_that_digest(runtime_files: tuple[Path, Path]) -> None:
    env, _ = runtime_files
    env.write_text(PODMAN_PINNED)
    assert container.running_image() == container.ContainerIdentity(DIGEST, "podman")
    fp = engine_fingerprint("invariant", "avx2", "order")
    assert fp.container_digest == DIGEST and fp.reported["container_source"] == "podman"
    assert fp.hash != engine_fingerprint("invariant", "avx2", "order", "none").hash


def test_podman_started_by_tag_claims_no_digest(runtime_files: tuple[Path, Path]) -> None:
    """A tag can be moved to any image: nothing pinned, so nothing claimed (not the imageid,
    which is the config digest, not the manifest digest governance approves)."""
    env, _ = runtime_files
    env.write_text(PODMAN_BY_TAG)
    ident = container.running_image()
    assert ident.digest == "none" and "not started by digest" in ident.source


def test_unprivileged_podman_container_claims_no_digest(
        runtime_files: tuple[Path, Path]) -> None:
    """podman 4 leaves /run/.containerenv empty unless the container is --privileged."""
    env, _ = runtime_files
    env.write_text("")
    ident = container.running_image()
    assert ident.digest == "none" and "--privileged" in ident.source


def test_kubernetes_downward_api_file(runtime_files: tuple[Path, Path]) -> None:
    env, k8s = runtime_files
    env.write_text(PODMAN_BY_TAG)  # the Kubernetes file wins where both exist
    k8s.parent.mkdir()
    k8s.write_text(f"registry.example/verinfer@{DIGEST}\n")
    assert container.running_image() == container.ContainerIdentity(DIGEST, "kubernetes")
    k8s.write_text(DIGEST)
    assert container.running_image().digest == DIGEST


@pytest.mark.parametrize("bad", ["", "latest", "sha256:" + "AB" * 32, "sha256:" + "ab" * 31,
                                 "sha512:" + "ab" * 64, DIGEST + "\nsha256:" + "00" * 32])
def test_malformed_kubernetes_digest_is_none(runtime_files: tuple[Path, Path], bad: str) -> None:
    _, k8s = runtime_files
    k8s.parent.mkdir()
    k8s.write_text(bad)
    assert container.running_image().digest == "none"


def test_operator_environment_cannot_set_the_digest(runtime_files: tuple[Path, Path],
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """The old VERINFER_CONTAINER_DIGEST variable let a host claim any approved image."""
    monkeypatch.setenv("VERINFER_CONTAINER_DIGEST", DIGEST)
    assert engine_fingerprint("invariant", "avx2", "order").container_digest == "none"


def test_huge_runtime_file_is_read_bounded(runtime_files: tuple[Path, Path]) -> None:
    env, _ = runtime_files
    env.write_text("x" * 10_000_000 + f'\nimage="v@{DIGEST}"\n')
    assert container.running_image().digest == "none"
