"""Moving anvil's blocks and clock for the verifier's node and challenger: the devnet's
shortcuts, kept out of the services (issue 33).

anvil mines a block only for a transaction and its clock moves only with wall time, so on a
devnet a challenge would wait for its draw block until some unrelated transaction came, and a
claim or a voting phase for its deadline (300 s and more). The services only wait for a real
chain (``VerifierNode.awaiting_block`` and ``Challenger.pass_deadline``/``nudge`` are no-ops
there); these subclasses and :func:`mine_pending_draws` move anvil instead. The devnet runs
:func:`mine_pending_draws` in a process of its own (``verinfer devnet mine-draws``) for its
verifier processes, and ``verinfer devnet challenge`` is ``verinfer challenge`` with a
:class:`TimeTravelChallenger`.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import Any

from verinfer.chain.anvil import increase_time, mine
from verinfer.chain.bindings import Contracts
from verinfer.chain.structs import Status
from verinfer.errors import VerinferError
from verinfer.verifier.chain_view import ChainView
from verinfer.verifier.challenger import Challenger
from verinfer.verifier.node import VerifierNode


def mine_pending_draws(view: ChainView, contracts: Contracts,
                       finished: set[int] | None = None) -> int:
    """Mines past the draw block of every opened challenge that waits for one; returns the
    blocks mined. ``finished`` (updated) skips the challenges already past their draw."""
    done = finished if finished is not None else set()
    mined = 0
    for oc in view.opened():
        if oc.challenge_id in done:
            continue
        info = contracts.challenges.challenge(oc.challenge_id)
        if info.status is not Status.AWAITING_DRAW:
            done.add(oc.challenge_id)
            continue
        number, _ = view.head()
        if number <= info.target_block:
            mine(view.w3, info.target_block - number + 1)
            mined += info.target_block - number + 1
    return mined


def run_draw_miner(view: ChainView, contracts: Contracts, *, interval_s: float = 0.25,
                   should_stop: Callable[[], bool] = lambda: False) -> None:
    """:func:`mine_pending_draws` every ``interval_s`` until ``should_stop``; a failed round
    (anvil restarting, a reverted call) is retried on the next."""
    finished: set[int] = set()
    while not should_stop():
        with contextlib.suppress(VerinferError, OSError):
            mine_pending_draws(view, contracts, finished)
        time.sleep(interval_s)


class MiningNode(VerifierNode):
    """A verifier node that mines anvil up to a challenge's draw block instead of waiting."""

    def awaiting_block(self, target_block: int, number: int) -> None:
        mine(self.view.w3, target_block - number + 1)


class TimeTravelChallenger(Challenger):
    """A challenger that moves anvil: past a claim's deadline at once, to a challenge's draw
    block, and past a voting phase's deadline once nothing else happens in it for
    ``stall_s`` seconds (or everyone has revealed)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._progress: dict[int, tuple[tuple[int, int, int], float]] = {}
        self.stall_s = 30.0  # no commit/reveal for this long: skip to the phase deadline

    def pass_deadline(self, deadline: int, now: int) -> bool:
        increase_time(self.view.w3, deadline - now + 1)
        return True

    def nudge(self, cid: int, info: Any) -> None:
        number, ts = self.view.head()
        if info.status is Status.AWAITING_DRAW and number <= info.target_block:
            mine(self.view.w3, info.target_block - number + 1)
        elif info.status is Status.VOTING:
            seen = (info.commits, info.reveals, info.status.value)
            last = self._progress.get(cid)
            if last is None or last[0] != seen:
                self._progress[cid] = (seen, time.monotonic())
                if info.reveals != info.members:
                    return
            elif time.monotonic() - last[1] < self.stall_s:
                return
            self._progress[cid] = (seen, time.monotonic())
            if info.commits < info.members and ts <= info.commit_deadline:
                increase_time(self.view.w3, info.commit_deadline - ts + 1)
            elif info.reveals < info.members and ts <= info.reveal_deadline:
                increase_time(self.view.w3, info.reveal_deadline - ts + 1)
            elif info.reveals == info.members or ts > info.reveal_deadline:
                with contextlib.suppress(VerinferError):
                    self.c.challenges.resolve(cid)
