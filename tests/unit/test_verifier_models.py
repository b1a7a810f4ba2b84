"""A verifier's models (ModelSet): one engine per model id, loaded only when a request names
it and kept; a model id it does not hold is an abstention (CannotJudgeError), never a guess."""

from __future__ import annotations

from pathlib import Path

import pytest

from verinfer.engine.tiny import write_tiny_llama
from verinfer.verifier.errors import CannotJudgeError
from verinfer.verifier.reexec import ModelSet, model_file_id


def test_model_set_loads_the_named_model_once_and_abstains_on_others(tmp_path: Path) -> None:
    p0 = write_tiny_llama(tmp_path / "a.gguf", seed=0)
    p1 = write_tiny_llama(tmp_path / "b.gguf", seed=1)
    ms = ModelSet([p0, p1])
    id1 = model_file_id(p1)
    assert set(ms.ids()) == {model_file_id(p0), id1}
    eng = ms(id1)
    assert eng.model_id == id1  # the second file's engine, not the first's
    assert ms(id1) is eng  # cached
    with pytest.raises(CannotJudgeError, match="not one of this verifier's models"):
        ms(b"\x11" * 32)
    with pytest.raises(ValueError, match="at least one model"):
        ModelSet([])
