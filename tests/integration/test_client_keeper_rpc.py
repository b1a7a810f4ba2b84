"""The receipt keeper against an RPC that never answers (a real loopback peer,
verinfer.testing.hostile.HostilePeer): every step gives up at its whole-call deadline, the
loop backs off with the injected randomness and keeps going, and no receipt moves — a failing
RPC never marks a receipt final or faulty, however far past its deadlines the wall clock is."""

from __future__ import annotations

import asyncio
import hashlib
import time
from pathlib import Path

import pytest

from verinfer.chain.deploy import Deployment
from verinfer.chain.errors import RpcDeadlineError
from verinfer.chain.rpc import RpcDeadlineExceeded
from verinfer.client.keeper import Keeper, KeeperPolicy
from verinfer.client.receipt_store import ReceiptStore, State
from verinfer.da_client.local import LocalDAClient
from verinfer.receipts.eip712 import Domain, Receipt, ReceiptSigner
from verinfer.receipts.signed import SignedReceipt
from verinfer.testing.hostile import HostilePeer

pytestmark = [pytest.mark.loopback]

DEP = Deployment(chain_id=31337, protocol_config="0x" + "01" * 20,
                 stake_registry="0x" + "02" * 20, batch_registry="0x" + "03" * 20,
                 challenge_manager="0x" + "04" * 20, audit_log="0x" + "05" * 20,
                 deployed_block=1)


def _old_receipt() -> SignedReceipt:
    signer = ReceiptSigner(hashlib.sha256(b"keeper rpc operator").digest())
    h = [hashlib.sha256(bytes([k])).digest() for k in range(5)]
    r = Receipt(operator=signer.address, chain_id=31337, model_id=h[0],
                engine_fingerprint_hash=h[1], req_hash=h[2], out_hash=h[3], key_epoch=1,
                ciphertext_hash=h[4], issued_at=1_000)  # every deadline long past
    return SignedReceipt.sign(r, Domain(31337, DEP.challenge_manager), signer)


def test_a_silent_rpc_moves_nothing_and_the_loop_backs_off(tmp_path: Path) -> None:
    store = ReceiptStore(tmp_path / "r.sqlite")
    s = _old_receipt()
    store.add(s)
    waits: list[float] = []
    with HostilePeer("silent") as rpc:
        keeper = Keeper.connect(store, rpc.url, DEP, LocalDAClient(tmp_path / "da"),
                                policy=KeeperPolicy(file_claims=False, rpc_deadline_s=0.3,
                                                    poll_s=0.01),
                                rng=lambda: 1.0)
        t0 = time.monotonic()
        # the provider's own whole-call deadline or the keeper's, whichever fires first
        with pytest.raises((RpcDeadlineError, RpcDeadlineExceeded), match="within"):
            keeper.step()
        assert time.monotonic() - t0 < 3
        # the thread loop: three failed steps, each wait from the backoff (jitter rng = 1.0)
        keeper.run(sleep=waits.append, until=lambda: len(waits) >= 3)
        assert waits == pytest.approx([1.2, 2.4, 4.8])
        assert keeper.last_error is not None and "within" in keeper.last_error

        # the asyncio follower stops when told, failing all the while
        async def follow() -> None:
            stop = asyncio.Event()
            task = asyncio.create_task(keeper.run_async(stop))
            await asyncio.sleep(0.8)
            stop.set()
            await asyncio.wait_for(task, 10)
        asyncio.run(follow())
    k = store.get("0x" + s.digest.hex())
    assert k.state is State.PENDING and store.history(k.id)[-1][1] is State.PENDING
