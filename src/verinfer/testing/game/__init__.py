"""An adversarial simulation of the whole slashing game against the real contracts on anvil
(docs/game.md): a seeded adversary takes random actions from the whole action table, the
honest parties run their real software, and invariants are checked after every step.

A test and bench tool (``tests/integration/test_game_sim.py``, ``bench/game.py``); no service
imports it.
"""

from verinfer.testing.game.play import Game, Violation, play, play_episode, replay
from verinfer.testing.game.world import World

__all__ = ["Game", "Violation", "World", "play", "play_episode", "replay"]
