"""The operator never signs a receipt the chain would find invalid on its face for coverage.

Attack: the last verifier declared for the operator's engine fingerprint undeclares for a few
seconds and declares again. Receipts issued coverageNotice after that dip are invalid at open
(StakeRegistry.isCoveredAt is false), so that verifier, as challenger, would collect a slash
of an honest operator. The readiness monitor only samples the chain every interval; the
per-receipt CoverageGuard reads the coverage at each receipt's own issuedAt before signing.
"""

from __future__ import annotations

import pytest

from verinfer.chain.structs import pool_key
from verinfer.operator.readiness import NotReadyError, Readiness
from verinfer.operator.runtime import ChainIdentity, CoverageGuard
from verinfer.receipts.eip712 import Receipt

FP = b"\x0f" * 32
OTHER_FP = b"\x0e" * 32
MODEL = b"\x01" * 32
OTHER_MODEL = b"\x05" * 32


class _Stakes:
    """Coverage of one pool, (FP, MODEL), as a set of issuedAt seconds it is NOT covered at."""

    def __init__(self, uncovered: set[int], *, fail: bool = False) -> None:
        self.uncovered, self.fail, self.reads = uncovered, fail, 0

    def is_covered_at(self, pool: bytes, issued_at: int) -> bool:
        self.reads += 1
        if self.fail:
            raise ConnectionError("rpc down")
        return pool == pool_key(FP, MODEL) and issued_at not in self.uncovered


class _Config:
    def is_approved(self, kind: object, ident: bytes) -> bool:
        return True


def _receipt(issued_at: int, fp: bytes = FP, model: bytes = MODEL) -> Receipt:
    return Receipt(operator="0x" + "11" * 20, chain_id=31337, model_id=model,
                   engine_fingerprint_hash=fp, req_hash=b"\x02" * 32, out_hash=b"\x03" * 32,
                   key_epoch=1, ciphertext_hash=b"\x04" * 32, issued_at=issued_at)


def test_a_dip_in_coverage_is_refused_exactly_at_its_seconds() -> None:
    stakes = _Stakes(uncovered={1_000_005, 1_000_006})
    guard = CoverageGuard(stakes)
    guard(_receipt(1_000_004))
    for t in (1_000_005, 1_000_006):
        with pytest.raises(NotReadyError) as e:
            guard(_receipt(t))
        assert e.value.status_code == 503 and "slashable" in e.value.message
    guard(_receipt(1_000_007))
    with pytest.raises(NotReadyError):  # a fingerprint nobody declared
        guard(_receipt(1_000_007, OTHER_FP))
    # issue 31 finding 4: the same fingerprint with a model nobody declared (the own engine's
    # fingerprint is the same for every model): its pool is uncovered, so it is refused
    with pytest.raises(NotReadyError, match="model"):
        guard(_receipt(1_000_007, FP, OTHER_MODEL))


def test_answers_are_cached_per_second_and_rpc_failure_refuses() -> None:
    stakes = _Stakes(uncovered=set())
    guard = CoverageGuard(stakes)
    for _ in range(5):
        guard(_receipt(2_000_000))
    assert stakes.reads == 1
    with pytest.raises(NotReadyError, match="cannot read the coverage"):
        CoverageGuard(_Stakes(set(), fail=True))(_receipt(2_000_000))


def test_readiness_blocks_while_uncovered_now() -> None:
    readiness = Readiness()
    now = [3_000_000.0]
    stakes = _Stakes(uncovered={3_000_000})
    ident = ChainIdentity(readiness, _Config(), MODEL, FP, stakes=stakes,
                          wall_clock=lambda: now[0])
    ident()
    assert "identity" in readiness.reasons()
    assert "no verifier is declared" in readiness.reasons()["identity"]
    now[0] += 1
    ident()  # blocked: re-checked on every call
    assert readiness.ready
