"""The benchmark's job clock: another busy Python thread's CPU is not the job's; the job's own
work is."""

from __future__ import annotations

import threading
import time

from verinfer.verifier.cpu_clock import job_cpu_time


def _spin(seconds: float) -> None:
    end = time.thread_time() + seconds
    x = 0
    while time.thread_time() < end:
        x += 1


def test_other_threads_cpu_is_excluded_and_own_cpu_is_counted() -> None:
    stop = threading.Event()

    def burn() -> None:
        while not stop.is_set():
            _spin(0.01)

    busy = threading.Thread(target=burn)
    busy.start()
    try:
        j0, p0 = job_cpu_time(), time.process_time()
        # The job idles while the other thread burns CPU; on a loaded machine the burner may get
        # little CPU per wall second, so wait (bounded) until it has burnt enough to measure.
        deadline = time.monotonic() + 10.0
        while time.process_time() - p0 <= 0.15 and time.monotonic() < deadline:
            time.sleep(0.05)
        idle_job, idle_proc = job_cpu_time() - j0, time.process_time() - p0
        j1 = job_cpu_time()
        _spin(0.2)
        own = job_cpu_time() - j1
    finally:
        stop.set()
        busy.join()
    assert idle_proc > 0.1  # the process was busy...
    assert idle_job < 0.05  # ...but not this job
    assert 0.15 < own < 0.6
