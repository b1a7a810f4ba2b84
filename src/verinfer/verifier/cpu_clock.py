"""CPU time of one job inside a busy process: process CPU minus the CPU of the process's other
Python threads (chain polling, other nodes, HTTP clients), read from Linux
/proc/self/task/<tid>/schedstat (ns). Native worker threads (torch's intra-op pool) and the
engine's own worker thread count towards the job: the job is what drives them. Where /proc is
absent this degrades to process CPU."""

from __future__ import annotations

import threading
import time
from pathlib import Path

ENGINE_THREAD_PREFIX = "verinfer-engine"


def _thread_cpu_s(native_id: int) -> float:
    try:
        return int(Path(f"/proc/self/task/{native_id}/schedstat").read_text().split()[0]) / 1e9
    except (OSError, ValueError, IndexError):
        return 0.0  # the thread ended (its CPU stays in process_time: a small overcount)


def job_cpu_time() -> float:
    """A clock whose differences are the calling job's CPU seconds (see module doc)."""
    me = threading.get_native_id()
    others = sum(_thread_cpu_s(t.native_id) for t in threading.enumerate()
                 if t.native_id is not None and t.native_id != me
                 and not t.name.startswith(ENGINE_THREAD_PREFIX))
    return time.process_time() - others
