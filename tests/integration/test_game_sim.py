"""The slashing game on anvil (docs/game.md): a short seeded adversarial run finds no
violation, a run replays from its trace to the same end, the issue-31 findings replay as
regression tests (each trace in game_traces/ broke an invariant on the contracts before
b826ef1), and the checker's promise is the one the params make."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from verinfer.testing.game.play import Game, play, play_episode, promised, replay
from verinfer.testing.game.world import World

TRACES = Path(__file__).resolve().parent / "game_traces"
ETH = 10**18


@pytest.fixture(scope="module")
def world() -> Iterator[World]:
    w = World(honest_verifiers=3, sybils=3)
    yield w
    w.close()


@pytest.fixture(scope="module")
def small_world() -> Iterator[World]:
    """One honest verifier and one sybil: the whole pool fits a committee."""
    w = World(honest_verifiers=1, sybils=1)
    yield w
    w.close()


def test_short_adversarial_run_keeps_every_invariant(world: World) -> None:
    s = play(world, seed=11, steps=60, episode_steps=30)
    assert s["steps"] == 60
    assert s["violations"] == 0, "\n".join(
        f"{v['kind']}: {v['detail']}\ntrace: {json.dumps(v['trace'])}"
        for v in s["violation_list"])
    # the run did play the game, not only reverts
    assert s["outcomes"], s
    assert s["actions"].get("serve_cheat", 0) > 0 and s["actions"].get("fuzz", 0) > 0


def test_small_pool_run_keeps_every_invariant(small_world: World) -> None:
    s = play(small_world, seed=3, steps=40, episode_steps=40)
    assert s["violations"] == 0, [v["detail"] for v in s["violation_list"]]


def test_episode_replays_from_its_trace(small_world: World) -> None:
    game = Game(small_world)
    first = play_episode(game, 5, 0, 25)
    again = replay(small_world, first.trace, seed=5, episode=0)
    assert [a["outcome"] for a in again.trace] == [a["outcome"] for a in first.trace]
    assert again.payoffs == first.payoffs and again.outcomes == first.outcomes


@pytest.mark.parametrize("name", sorted(p.name for p in TRACES.glob("*.json")))
def test_issue31_finding_replays_clean(name: str, world: World, small_world: World) -> None:
    case = json.loads((TRACES / name).read_text())
    w = small_world if case["world"] == {"honest_verifiers": 1, "sybils": 1} else world
    assert case["world"] == {"honest_verifiers": len(w.honest_verifiers),
                             "sybils": len(w.sybils)}
    res = replay(w, case["trace"], seed=case["seed"], episode=case["episode"])
    assert len(res.trace) == len(case["trace"])
    assert not res.violations, f"{case['finding']}: {[str(v) for v in res.violations]}"


def test_promise_is_tau_or_one_dissenter_among_equals() -> None:
    h = {"h1", "h2", "h3"}
    # 2 of 3 equal seats: promised whatever tau's rounding (6667 bps is above 2/3)
    assert promised([("h1", ETH), ("h2", ETH), ("x", ETH)], h, 6667)
    # a heavier dissenter may block: not promised below tau
    assert not promised([("h1", ETH), ("h2", ETH), ("x", 2 * ETH)], h, 6666)
    # two seats: no tau above 1/2 lets one of two equals decide
    assert not promised([("h1", ETH), ("x", ETH)], h, 5001)
    assert promised([("h1", 10 * ETH), ("x", ETH)], h, 6666)
    assert not promised([], h, 6666)
