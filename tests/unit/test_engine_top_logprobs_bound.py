"""The ExecRequest's top_logprobs bound has one home (``Engine.check_top_logprobs``): submit and
replay refuse the same values with the same error, on every backend (the vLLM one inherits it)."""

from __future__ import annotations

import pytest

from verinfer.engine.engine import Engine
from verinfer.errors import InvalidRequestError
from verinfer.protocol.exec_request import MAX_TOP_LOGPROBS
from verinfer.protocol.sampling_params import SamplingParams

GREEDY = SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True)


@pytest.mark.parametrize("bad", [-1, MAX_TOP_LOGPROBS + 1])
def test_submit_and_replay_refuse_the_same_bound(tiny_engine: Engine, bad: int) -> None:
    with pytest.raises(InvalidRequestError) as submitted:
        tiny_engine.submit([5, 6, 7], GREEDY, top_logprobs=bad)
    with pytest.raises(InvalidRequestError) as replayed:
        tiny_engine.replay([5, 6, 7], [1, 2], GREEDY, top_logprobs=bad)
    assert submitted.value.param == replayed.value.param == "top_logprobs"
    assert submitted.value.message == replayed.value.message


@pytest.mark.parametrize("ok", [None, 0, MAX_TOP_LOGPROBS])
def test_the_bound_is_inclusive(ok: int | None) -> None:
    Engine.check_top_logprobs(ok)
