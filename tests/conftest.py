from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from verinfer.engine.engine import Engine
from verinfer.engine.loader import LoadedModel, load_model
from verinfer.engine.tiny import write_tiny_llama


@pytest.fixture(scope="session")
def tiny_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_llama(tmp_path_factory.mktemp("models") / "tiny.gguf", seed=0)


@pytest.fixture(scope="session")
def tiny_loaded(tiny_path: Path) -> LoadedModel:
    return load_model(tiny_path)


@pytest.fixture(scope="session")
def tiny_engine(tiny_loaded: LoadedModel) -> Iterator[Engine]:
    eng = Engine(tiny_loaded, "invariant", max_seqs=16, max_batch_tokens=48)
    yield eng
    eng.close()


@pytest.fixture(scope="session")
def tiny_engine_fast(tiny_loaded: LoadedModel) -> Iterator[Engine]:
    eng = Engine(tiny_loaded, "fast", max_seqs=16, max_batch_tokens=48)
    yield eng
    eng.close()
