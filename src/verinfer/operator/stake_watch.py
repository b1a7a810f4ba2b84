"""The operator's watch on its own stake against the operator minimum (issue 31).

``BatchRegistry.commitBatch`` refuses an operator whose active stake (stake - unbonding) is below
``StakeRegistry.minOperatorStake``; a receipt it signed and then cannot commit misses its
publication deadline and is slashed by any stranger's ``claimUnpublished``. Governance may raise
the minimum: the raise applies ``maxDisputeSpan + coverageNotice`` after the first
``syncParams`` that sees it (``MinimumRaisePending(Operator, current, pending, effectiveAt)``;
``StakeRegistry.pendingMinOperatorStake`` / ``pendingMinOperatorStakeAt``), which leaves an
operator time to bond the shortfall (``verinfer operator stake``) or to stop signing and
commit what it signed.

:class:`OperatorStakeWatch` reads that state at each step of the operator's chain watcher (the
claim responder, :mod:`verinfer.operator.claims`) and says so in the log, once per change and
again every ``repeat_s`` while a shortfall lasts:

* a raise pending and the active stake short of it: a WARNING naming the new minimum, the
  effective chain time and (estimated) block, and the shortfall in wei;
* a raise set in ProtocolConfig but not synced yet (its notice starts at the first sync): a
  WARNING with the shortfall;
* the active stake below the minimum in force: an ERROR (batches are refused now).

operator.json has no automatic top-up (bonding moves the operator's own funds; that stays the
operator's decision): the warning says how much to bond.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from verinfer.chain.bindings import ProtocolConfigContract, StakeRegistryContract
from verinfer.chain.structs import ETHER

log = logging.getLogger(__name__)

#: Blocks over which the recent block time is measured (for the effective-block estimate).
BLOCK_TIME_WINDOW = 64
#: Seconds a block is assumed to take when the chain is too young to measure (Ethereum's slot).
DEFAULT_BLOCK_TIME_S = 12.0
#: While a shortfall lasts, the warning is repeated this often (seconds of the local clock).
REPEAT_S = 600.0


@dataclass(frozen=True)
class MinimumStatus:
    """The operator's stake against the operator minimum, read at one chain head."""

    active: int  # stake - unbonding, wei
    minimum: int  # the minimum in force now (StakeRegistry.minOperatorStake)
    pending: int  # a raise waiting for its notice (0 = none)
    effective_at: int  # chain time from which `pending` may be applied (0 = none)
    configured: int  # ProtocolConfig's minOperatorStake (a raise not yet synced if > both)
    head_block: int
    head_time: int

    @property
    def target(self) -> int:
        """The minimum the operator must meet to stay active through every known change."""
        return max(self.minimum, self.pending, self.configured)

    @property
    def shortfall(self) -> int:
        """Wei to bond to meet :attr:`target` (0: enough)."""
        return max(0, self.target - self.active)

    @property
    def below_minimum(self) -> bool:
        """Batches are refused now (commitBatch: NotActiveOperator)."""
        return self.active < self.minimum

    @property
    def unsynced(self) -> bool:
        """A raise set in ProtocolConfig that no syncParams has seen yet."""
        return self.configured > self.minimum and self.configured != self.pending


def _amount(wei: int) -> str:
    """Exact decimal ETH, as `verinfer operator stake --amount` takes it."""
    return f"{(Decimal(wei) / ETHER).normalize():f}"


def _eth(wei: int) -> str:
    return f"{_amount(wei)} ETH"


@dataclass
class OperatorStakeWatch:
    """Reads :class:`MinimumStatus` for ``operator`` and logs what it means (module doc)."""

    w3: Any  # web3.Web3
    stakes: StakeRegistryContract
    config: ProtocolConfigContract
    operator: str
    repeat_s: float = REPEAT_S
    clock: Callable[[], float] = time.monotonic

    def __post_init__(self) -> None:
        self.status: MinimumStatus | None = None
        self._said: tuple[object, ...] | None = None
        self._said_at = 0.0

    def check(self) -> MinimumStatus:
        """Read the state at the chain head, log it if it changed (or a shortfall is due a
        reminder), and return it."""
        head = self.w3.eth.get_block("latest")
        acct = self.stakes.account_of(self.operator)
        pending, effective_at = self.stakes.pending_min_operator_stake()
        st = MinimumStatus(
            active=acct.stake - acct.unbonding, minimum=self.stakes.min_operator_stake(),
            pending=pending, effective_at=effective_at,
            configured=self.config.params().min_operator_stake,
            head_block=int(head["number"]), head_time=int(head["timestamp"]))
        self.status = st
        key = (st.minimum, st.pending, st.effective_at, st.configured, st.active)
        now = self.clock()
        if key != self._said or (st.shortfall and now - self._said_at >= self.repeat_s):
            self._say(st)
            self._said, self._said_at = key, now
        return st

    def effective_block(self, st: MinimumStatus) -> int:
        """The block the pending raise is expected in (an estimate from the recent block time:
        the contract counts chain time)."""
        wait = st.effective_at - st.head_time
        if wait <= 0:
            return st.head_block
        return st.head_block + -(-wait // self._block_time_s(st))

    def _block_time_s(self, st: MinimumStatus) -> int:
        lo = max(0, st.head_block - BLOCK_TIME_WINDOW)
        if lo == st.head_block:
            return int(DEFAULT_BLOCK_TIME_S)
        then = int(self.w3.eth.get_block(lo)["timestamp"])
        return max(1, round((st.head_time - then) / (st.head_block - lo)))

    def _say(self, st: MinimumStatus) -> None:
        who = self.operator
        if st.below_minimum:
            log.error("operator %s is NOT an active operator: active stake %s (%d wei) is below "
                      "the operator minimum %s in force; commitBatch is refused and every "
                      "receipt signed now is slashable as unpublished: bond %d wei more "
                      "(`verinfer operator stake DIR --amount %s`)", who, _eth(st.active),
                      st.active, _eth(st.minimum), st.minimum - st.active,
                      _amount(st.minimum - st.active))
        if st.pending:
            block = self.effective_block(st)
            if st.active < st.pending:
                log.warning(
                    "governance raised the operator minimum from %s to %s: effective at chain "
                    "time %d (about block %d, in %d s; now block %d). Operator %s has %s active: "
                    "shortfall %d wei (%s). Bond it before then (`verinfer operator stake DIR "
                    "--amount %s`) or stop signing a publication deadline before it: batches "
                    "are refused from then on", _eth(st.minimum), _eth(st.pending),
                    st.effective_at, block, max(0, st.effective_at - st.head_time),
                    st.head_block, who, _eth(st.active), st.pending - st.active,
                    _eth(st.pending - st.active), _amount(st.pending - st.active))
            else:
                log.info("operator minimum raise to %s pending (effective at chain time %d, "
                         "about block %d): active stake %s suffices", _eth(st.pending),
                         st.effective_at, block, _eth(st.active))
        if st.unsynced and st.active < st.configured:
            log.warning(
                "ProtocolConfig sets the operator minimum to %s (in force: %s), not yet synced: "
                "its notice starts at the next StakeRegistry.syncParams. Operator %s has %s "
                "active: shortfall %d wei", _eth(st.configured), _eth(st.minimum), who,
                _eth(st.active), st.configured - st.active)
        if not st.shortfall and not st.pending and self._said is not None:
            log.info("operator %s meets the operator minimum %s (active %s)", who,
                     _eth(st.minimum), _eth(st.active))


__all__ = ["MinimumStatus", "OperatorStakeWatch"]
