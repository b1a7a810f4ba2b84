"""Running a bench script the way a person does (``.venv/bin/python bench/NAME.py ARGS`` from the
repository root) and checking the one JSON object it ends with: the bench smoke tests
(tests/*/test_bench_smoke*.py) share this, so "a bench ran" means the same thing in each."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench"

Check = Callable[[Any], bool]


def _number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


def rate(v: Any) -> bool:
    """A finite number > 0: a rate, a time, a size, a ratio of two of them."""
    return _number(v) and v > 0


def number(v: Any) -> bool:
    """A finite number (may be 0: a time rounded below its precision, an offset)."""
    return _number(v)


def count(v: Any) -> bool:
    """A whole number >= 0 (not a bool)."""
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def flag(v: Any) -> bool:
    return isinstance(v, bool)


def text(v: Any) -> bool:
    return isinstance(v, str) and v != ""


def mapping(v: Any) -> bool:
    return isinstance(v, dict)


def rate_or_none(v: Any) -> bool:
    return v is None or rate(v)


def run_bench(name: str, *args: str, timeout: float, env: Mapping[str, str] | None = None
              ) -> dict[str, Any]:
    """Runs bench/NAME.py with ``args`` from the repository root (``env`` added to this
    process's environment) and returns its last stdout line parsed as a JSON object; fails the
    test with the script's stderr tail otherwise."""
    cmd = [sys.executable, str(BENCH / f"{name}.py"), *args]
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout,
                       env={**os.environ, **(env or {})})
    assert r.returncode == 0, f"{' '.join(cmd[1:])} exited {r.returncode}:\n{r.stderr[-4000:]}"
    lines = r.stdout.strip().splitlines()
    assert lines, f"bench/{name}.py printed nothing on stdout; stderr:\n{r.stderr[-2000:]}"
    try:
        out = json.loads(lines[-1])
    except json.JSONDecodeError as e:
        raise AssertionError(f"bench/{name}.py: last stdout line is not JSON ({e}): "
                             f"{lines[-1][:500]!r}") from e
    assert isinstance(out, dict), f"bench/{name}.py: last line is JSON but not an object"
    return out


def expect(out: Mapping[str, Any], checks: Mapping[str, Check], where: str = "") -> None:
    """Every key of ``checks`` is in ``out`` and passes its check; all failures in one message."""
    bad = [f"{where}{k}: missing" for k in checks if k not in out]
    bad += [f"{where}{k}={out[k]!r} fails {c.__name__}" for k, c in checks.items()
            if k in out and not c(out[k])]
    assert not bad, "; ".join(bad)


def expect_each(rows: Sequence[Any], checks: Mapping[str, Check], where: str) -> None:
    assert isinstance(rows, list) and rows, f"{where}: expected a non-empty list, got {rows!r}"
    for i, row in enumerate(rows):
        assert isinstance(row, dict), f"{where}[{i}] is not an object"
        expect(row, checks, f"{where}[{i}].")
