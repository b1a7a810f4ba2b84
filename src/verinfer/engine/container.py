"""The running container image's own digest, as the container runtime states it.

The engine fingerprint names the image the engine runs in (docs/deploy.md). That digest must
come from the runtime that started the process, never from a value the operator types (an
environment variable or a flag would let a host claim any approved image). Two sources:

* podman writes ``/run/.containerenv`` into every container, with its fields only for a
  ``--privileged`` container (podman 4; otherwise the file is empty). Its ``image=`` line is
  the reference the container was started from; started by digest (``name@sha256:…``, which
  is how an operator pins an image) it carries the manifest digest that podman resolved in
  its own storage. Started by tag, there is no pinned digest to claim.
* Kubernetes pins the image by digest in the pod spec and hands it to the container through a
  downward-API volume (``/etc/verinfer/podinfo/image-digest``, from the pod annotation
  ``verinfer.dev/image-digest`` that deploy/k8s sets next to ``image: …@sha256:…``).

When neither names a digest the fingerprint says ``none``: receipts then never claim a digest
they did not run under. The paths are module constants so tests can point them elsewhere; they
are not configuration.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

#: what the fingerprint records when the process runs in no pinned image
NO_CONTAINER = "none"
CONTAINERENV = Path("/run/.containerenv")
K8S_DIGEST_FILE = Path("/etc/verinfer/podinfo/image-digest")
_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
_PINNED_REF = re.compile(r"@(sha256:[0-9a-f]{64})$")
_MAX_READ = 64 * 1024  # both files are a few hundred bytes; never read a huge one whole


@dataclass(frozen=True)
class ContainerIdentity:
    """``digest``: ``sha256:<64 hex>`` or :data:`NO_CONTAINER`; ``source``: where it was read
    (``podman``, ``kubernetes``) or why there is none (reported, never hashed)."""

    digest: str
    source: str


def _read(path: Path) -> str | None:
    try:
        with path.open("rb") as f:
            return f.read(_MAX_READ).decode("utf-8", "replace")
    except OSError:
        return None


def _containerenv_fields(text: str) -> dict[str, str]:
    """``key="value"`` lines (podman quotes values with Go's %q)."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep:
            out[key.strip()] = value.strip().strip('"')
    return out


def from_containerenv(text: str) -> ContainerIdentity:
    if not text.strip():
        return ContainerIdentity(NO_CONTAINER, "podman: /run/.containerenv is empty (podman "
                                               "states the image only to --privileged "
                                               "containers)")
    fields = _containerenv_fields(text)
    image = fields.get("image", "")
    m = _PINNED_REF.search(image)
    if m is None:
        return ContainerIdentity(NO_CONTAINER, f"podman: image {image[:200]!r} was not started "
                                               "by digest (name@sha256:…)")
    return ContainerIdentity(m.group(1), "podman")


def from_k8s_file(text: str) -> ContainerIdentity:
    value = text.strip()
    ref = _PINNED_REF.search(value)
    digest = ref.group(1) if ref else value
    if not _DIGEST.fullmatch(digest):
        return ContainerIdentity(NO_CONTAINER, "kubernetes: the downward-API image digest is "
                                               f"not sha256:<64 hex> ({value[:80]!r})")
    return ContainerIdentity(digest, "kubernetes")


def running_image() -> ContainerIdentity:
    """The digest of the image this process runs in, or :data:`NO_CONTAINER` with the reason."""
    k8s = _read(K8S_DIGEST_FILE)
    if k8s is not None:
        return from_k8s_file(k8s)
    env = _read(CONTAINERENV)
    if env is not None:
        return from_containerenv(env)
    return ContainerIdentity(NO_CONTAINER, "not in a container (no /run/.containerenv, no "
                                           "Kubernetes image-digest file)")
