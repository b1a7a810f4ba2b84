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
XDIST_FIRST = {"e2e": 0, "slow": 1, "integration": 2, "adversarial": 3, "unit": 4}
# The longest files of a CI run (--durations at the last landing, 3 workers): started first so
# that none of them is what the other workers wait for at the end.
XDIST_HEAVIEST = ("e2e/test_image.py", "e2e/test_vllm_backend.py",
                  "slow/test_bench_smoke_gemma.py", "integration/test_bench_smoke.py",
                  "e2e/test_devnet_challenges.py", "slow/test_gemma_correctness.py")


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
    if hasattr(config, "workerinput"):
        # Under pytest-xdist (.ci/run: `-n 3 --dist loadfile --no-loadscope-reorder`; without
        # the last flag xdist sorts files by their number of tests) the controller hands out
        # whole files in this order: the long ones (real processes, the devnet, the image
        # builds, the real Gemma) first, so that no worker starts a ten-minute file at the end.
        items.sort(key=_xdist_rank)


def _xdist_rank(item: pytest.Item) -> tuple[int, int]:
    path = Path(str(item.path)).resolve()
    rel = path.relative_to(TESTS).as_posix() if path.is_relative_to(TESTS) else ""
    heavy = XDIST_HEAVIEST.index(rel) if rel in XDIST_HEAVIEST else len(XDIST_HEAVIEST)
    return heavy, XDIST_FIRST.get(rel.split("/")[0], len(XDIST_FIRST))


def _redis_answers() -> bool:
    try:
        with socket.create_connection(SHARED_REDIS, timeout=0.5) as s:
            s.sendall(b"PING\r\n")
            return s.recv(16).startswith(b"+PONG")
    except OSError:
        return False


def _marker_selected(config: pytest.Config, marker: str) -> bool:
    """Whether ``-m`` can select tests that carry ``marker`` (no ``-m``: yes)."""
    expr = config.getoption("markexpr", "") or ""
    if not expr:
        return True
    try:  # pytest's own -m grammar; should it move, err on the side of starting Redis
        from _pytest.mark.expression import Expression

        def matches(name: str, /, **_: str | int | bool | None) -> bool:
            return name == marker

        return Expression.compile(expr).evaluate(matches)
    except (ImportError, pytest.UsageError):
        return True


_redis_ensured = False


def pytest_collect_file(file_path: Path, parent: pytest.Collector) -> None:
    """The integration, e2e and adversarial tests (and the devnet) use the shared Redis on
    127.0.0.1:6379: start it (scripts/ensure-redis) before the first such test module is
    imported — their skip conditions probe the server at import — when ``-m`` can select it and
    nothing answers, so the suite does not depend on a server someone else started. The unit
    loop (``-m unit``) never needs it and never starts it."""
    global _redis_ensured
    if _redis_ensured or not file_path.name.startswith("test_") or file_path.suffix != ".py":
        return
    path = file_path.resolve()
    if not path.is_relative_to(TESTS) or len(path.relative_to(TESTS).parts) < 2:
        return
    marker = DIRECTORY_MARKERS.get(path.relative_to(TESTS).parts[0])
    if marker in (None, "unit") or not _marker_selected(parent.config, marker):
        return
    _redis_ensured = True
    if not _redis_answers():
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
