"""An adversarial simulation of the whole slashing game against the real contracts on anvil
(docs/game.md): a seeded adversary takes random actions from the whole action table, the
honest parties run their real software, and invariants are checked after every step.

A test and bench tool (``tests/integration/test_game_sim.py``, ``bench/game.py``); no service
imports it.
"""
