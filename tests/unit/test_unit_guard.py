"""tests/conftest.py: a `unit` test that starts a process or opens a socket fails, whatever the
code under test does with the refusal; a test that declares the need runs as usual, and the
`unit` marker is computed from the needs."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

pytest_plugins = ["pytester"]
# the suites run below in this process start a process themselves (test_declared)
pytestmark = pytest.mark.process
TESTS = Path(__file__).resolve().parents[1]
ROOT = TESTS.parent

ESCAPES = '''
import socket, subprocess, sys
import pytest

def test_spawns():
    subprocess.run([sys.executable, "-c", "pass"], check=True)

def test_spawns_and_swallows():
    try:
        subprocess.run([sys.executable, "-c", "pass"], check=True)
    except BaseException:
        pass

def test_binds():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))

def test_connects():
    try:
        socket.create_connection(("127.0.0.1", 9), timeout=0.1)
    except Exception:
        pass

def test_pure():
    assert sum(range(4)) == 6

@pytest.mark.process
def test_declared():
    subprocess.run([sys.executable, "-c", "pass"], check=True)
'''


@pytest.fixture()
def suite(pytester: pytest.Pytester) -> pytest.Pytester:
    (pytester.path / "tests" / "unit").mkdir(parents=True)
    shutil.copy(TESTS / "conftest.py", pytester.path / "tests" / "conftest.py")
    shutil.copy(ROOT / "pyproject.toml", pytester.path / "pyproject.toml")
    (pytester.path / "tests" / "unit" / "test_escapes.py").write_text(ESCAPES)
    return pytester


def test_unit_tests_that_spawn_or_open_sockets_fail(suite: pytest.Pytester) -> None:
    result = suite.runpytest_inprocess("-p", "no:cacheprovider", "-q", "tests/unit")
    result.assert_outcomes(passed=6)  # the guard is armed by `-m unit...` (the fast loop) only
    result = suite.runpytest_inprocess("-p", "no:cacheprovider", "-q", "-m", "unit and not slow",
                                       "tests/unit")
    result.assert_outcomes(passed=1, failed=4, deselected=1)
    for name in ("test_spawns", "test_spawns_and_swallows", "test_binds", "test_connects"):
        result.stdout.fnmatch_lines([f"FAILED tests/unit/test_escapes.py::{name} *"])
    result.stdout.fnmatch_lines(["*is a `unit` test*"])


def test_unit_marker_follows_the_needs(suite: pytest.Pytester) -> None:
    result = suite.runpytest_inprocess("-p", "no:cacheprovider", "-q", "-m", "unit",
                                       "--collect-only", "tests/unit")
    result.stdout.fnmatch_lines(["*5/6 tests collected (1 deselected)*"])
    result = suite.runpytest_inprocess("-p", "no:cacheprovider", "-q", "-m", "process",
                                       "tests/unit")
    result.assert_outcomes(passed=1, deselected=5)
