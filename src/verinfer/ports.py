"""Free loopback ports for the processes the project starts on one machine (anvil, KMS shards,
the devnet's services, tests and benches): the one home of the rule for picking them."""

from __future__ import annotations

import socket


def free_ports(n: int, host: str = "127.0.0.1") -> list[int]:
    """``n`` distinct free ports on ``host``: every socket stays bound until all ``n`` are
    chosen (picked one at a time, a port released by the previous pick can come back: a CI run
    once gave KMS shards 3 and 5 the same port, so the explorer saw shard 5 twice)."""
    if n < 0:
        raise ValueError(f"free_ports: n must be >= 0, got {n}")
    socks: list[socket.socket] = []
    try:
        for _ in range(n):
            s = socket.socket()
            socks.append(s)
            s.bind((host, 0))
        return [int(s.getsockname()[1]) for s in socks]
    finally:
        for s in socks:
            s.close()


def free_port(host: str = "127.0.0.1") -> int:
    """One free port on ``host`` (loopback by default)."""
    return free_ports(1, host)[0]
