"""Progress lines of the devnet's long commands (`devnet up`, `devnet demo`): light to import,
so the first line comes before the heavy libraries load."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

from rich.console import Console

#: While a step runs, a line at least this often (a spinner says nothing to a log or a pipe).
HEARTBEAT_S = 5.0


class Steps:
    """Progress of a long command: a line per step with the seconds since ``t0``, and while
    a step runs a line every ``heartbeat_s`` naming it (on a terminal and in a log alike)."""

    def __init__(self, out: Console | None = None, t0: float | None = None,
                 heartbeat_s: float = HEARTBEAT_S) -> None:
        self.out = out or Console(stderr=True)
        self.t0 = time.monotonic() if t0 is None else t0
        self.heartbeat_s = heartbeat_s

    def say(self, text: str) -> None:
        self.out.print(f"{time.monotonic() - self.t0:5.0f} s  {text}", highlight=False)

    @contextmanager
    def step(self, text: str) -> Iterator[None]:
        self.say(text + "…")
        started = time.monotonic()
        done = threading.Event()

        def beat() -> None:
            while not done.wait(self.heartbeat_s):
                self.say(f"  still {text} ({time.monotonic() - started:.0f} s)")

        t = threading.Thread(target=beat, name="devnet-steps", daemon=True)
        t.start()
        try:
            yield
        finally:
            done.set()
            t.join()
