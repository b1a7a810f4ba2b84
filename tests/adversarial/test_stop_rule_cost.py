"""A client (or a challenger) makes the stop rule cost quadratic CPU.

The attack: the stop rule used to re-decode the whole output after every token (and replay
called it once per claimed token), then search every stop string in the whole text: a request
with a long ``max_tokens`` and a few stop strings that never match costs the operator
O(n^2) detokenization (287 us per step at 1,500 tokens, growing linearly), and a challenger
who gets a verifier to replay long claims makes it pay the same on every replay. Who gains: a
client paying per token (the operator's CPU per billed token grows with the length), a
griefer slowing every other request sharing the engine's one worker thread.

Fix (one home, engine/stop_rule.py ``StopState``): the rule is evaluated one token at a
time, each token's bytes decoded once and only the window a new token can change searched
(proven equal to the full-decode definition in tests/unit/test_stop_rule.py). Measured here as
work, not time (timing is noise on a shared CI machine): the number of token byte look-ups
the tokenizer does during a decode and a replay of ``N`` tokens must stay linear in ``N``.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from verinfer.engine.engine import Engine
from verinfer.engine.stop_rule import stop_rule
from verinfer.protocol.sampling_params import SamplingParams

N = 160


@pytest.fixture
def counted(tiny_engine: Engine, monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """Counts every token-byte look-up of the engine's tokenizer (decode goes through it)."""
    tok = tiny_engine.tokenizer
    calls = [0]
    real = tok.token_bytes

    def token_bytes(token_id: int) -> bytes:
        calls[0] += 1
        return real(token_id)

    monkeypatch.setattr(tok, "token_bytes", token_bytes)
    yield calls


def test_decode_and_replay_detokenize_each_token_a_bounded_number_of_times(
        tiny_engine: Engine, counted: list[int]) -> None:
    prompt = tiny_engine.tokenizer.encode("the stop rule must not be quadratic")
    # stop strings that never match (chars outside the tiny vocabulary's output), EOS ignored:
    # the request runs to max_tokens, the worst case for the rule
    params = SamplingParams(max_tokens=N, temperature=0.8, seed=7, ignore_eos=True,
                            stop=("\x00\x01never", "\x02also never"))
    counted[0] = 0
    gen = tiny_engine.generate(prompt, params)
    decode_lookups = counted[0]
    assert len(gen.token_ids) == N and gen.finish_reason == "length"
    counted[0] = 0
    rep = tiny_engine.replay(prompt, gen.token_ids, params)
    replay_lookups = counted[0]
    assert rep.matches and rep.finish_reason == "length"
    # linear: at most two look-ups per token (quadratic was N*(N+1)/2 = 12,880 each)
    assert decode_lookups <= 2 * N, decode_lookups
    assert replay_lookups <= 2 * N, replay_lookups
    # and the answer is still the definition's
    assert (gen.finish_reason, gen.text) == stop_rule(tiny_engine.tokenizer, gen.token_ids,
                                                      params)
