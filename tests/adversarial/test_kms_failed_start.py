"""A KMS cluster start that fails leaves no shard behind.

`devnet up` recorded the shards' pids only after every shard answered /health: when one shard
missed the deadline (seen under load: "shard 1 not healthy"), the others kept running, unrecorded,
so `devnet down` could not stop them and they held their ports and data directories."""

from __future__ import annotations

from pathlib import Path

import pytest

from adversarial.kms_adversary import make_cluster
from verinfer.kms.errors import ShardUnavailableError
from verinfer.kms.local_cluster import ShardProcesses

pytestmark = pytest.mark.process


def test_a_shard_that_misses_the_deadline_stops_every_shard_started(tmp_path: Path) -> None:
    lay, _ = make_cluster(tmp_path, n=3, t=2)
    procs = ShardProcesses(lay)
    started: list[object] = []
    real_wait = procs._wait_healthy

    def wait_then_fail(info, deadline):  # type: ignore[no-untyped-def]
        started.extend(procs.procs.values())
        if info.index == 2:
            raise ShardUnavailableError(f"shard {info.index} not healthy at {info.url}")
        real_wait(info, deadline)

    procs._wait_healthy = wait_then_fail  # type: ignore[method-assign]
    with pytest.raises(ShardUnavailableError, match="shard 2"):
        procs.start()
    assert len({id(p) for p in started}) == 3
    assert procs.procs == {}
    assert all(p.poll() is not None for p in started)  # type: ignore[attr-defined]
