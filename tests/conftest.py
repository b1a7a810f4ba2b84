from __future__ import annotations

import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:  # the engine (torch, the kernels) is imported by the fixtures that need it,
    # so collecting a fast subset (`pytest -m unit`) does not pay for it up front
    from verinfer.engine.engine import Engine
    from verinfer.engine.loader import LoadedModel

ROOT = Path(__file__).resolve().parents[1]
TESTS = Path(__file__).resolve().parent

# One marker per test directory, applied here so that no file can forget it and the fast loop
# is `pytest -m unit` (README.md). Registered in pyproject.toml ([tool.pytest.ini_options]).
DIRECTORY_MARKERS = {
    "unit": "unit",
    "integration": "integration",
    "e2e": "e2e",
    "slow": "slow",
    "adversarial": "adversarial",
}
SHARED_REDIS = ("127.0.0.1", 6379)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        path = Path(str(item.path)).resolve()
        if not path.is_relative_to(TESTS):
            continue  # a file named on the command line from elsewhere: not ours to mark
        rel = path.relative_to(TESTS)
        marker = DIRECTORY_MARKERS.get(rel.parts[0]) if len(rel.parts) > 1 else None
        if marker is None:
            raise pytest.UsageError(f"{rel}: tests live in one of {sorted(DIRECTORY_MARKERS)}")
        item.add_marker(getattr(pytest.mark, marker))


def _redis_answers() -> bool:
    try:
        with socket.create_connection(SHARED_REDIS, timeout=0.5) as s:
            s.sendall(b"PING\r\n")
            return s.recv(16).startswith(b"+PONG")
    except OSError:
        return False


def pytest_collection_finish(session: pytest.Session) -> None:
    """The integration, e2e and adversarial tests (and the devnet) use the shared Redis on
    127.0.0.1:6379: start it when such a test is selected and nothing answers there, so the
    suite does not depend on a server someone else started. Unit tests never need it."""
    if any(item.get_closest_marker("unit") is None for item in session.items) \
            and not _redis_answers():
        subprocess.run([str(ROOT / "scripts" / "ensure-redis")], check=False, timeout=300)


@pytest.fixture(scope="session")
def tiny_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from verinfer.engine.tiny import write_tiny_llama

    return write_tiny_llama(tmp_path_factory.mktemp("models") / "tiny.gguf", seed=0)


@pytest.fixture(scope="session")
def tiny_loaded(tiny_path: Path) -> LoadedModel:
    from verinfer.engine.loader import load_model

    return load_model(tiny_path)


@pytest.fixture(scope="session")
def tiny_engine(tiny_loaded: LoadedModel) -> Iterator[Engine]:
    from verinfer.engine.engine import Engine

    eng = Engine(tiny_loaded, "invariant", max_seqs=16, max_batch_tokens=48)
    yield eng
    eng.close()


@pytest.fixture(scope="session")
def tiny_engine_fast(tiny_loaded: LoadedModel) -> Iterator[Engine]:
    from verinfer.engine.engine import Engine

    eng = Engine(tiny_loaded, "fast", max_seqs=16, max_batch_tokens=48)
    yield eng
    eng.close()
