"""The one parser of untrusted JSON: bounded size and depth, never a crash."""

from __future__ import annotations

import subprocess
import sys

import pytest

from verinfer.protocol.jsonsafe import MAX_DEPTH, UntrustedJsonError, loads_untrusted, max_depth


def test_parses_ordinary_json() -> None:
    got = loads_untrusted(b'{"a": [1, {"b": "x"}], "c": null}')
    assert got == {"a": [1, {"b": "x"}], "c": None}
    assert loads_untrusted('"\\u00e9"') == "é"


def test_brackets_inside_strings_do_not_count() -> None:
    s = '{"stop": "' + "[" * 5000 + '\\"]}"}'
    assert max_depth(s.encode()) == 1
    assert loads_untrusted(s)["stop"].startswith("[[[")


def test_depth_limit_is_inclusive() -> None:
    ok = "[" * MAX_DEPTH + "]" * MAX_DEPTH
    assert max_depth(ok.encode()) == MAX_DEPTH
    loads_untrusted(ok)
    with pytest.raises(UntrustedJsonError, match="nesting depth 65"):
        loads_untrusted("[" + ok + "]")


def test_size_limit() -> None:
    with pytest.raises(UntrustedJsonError, match="exceeds the limit of 10"):
        loads_untrusted(b'"' + b"x" * 20 + b'"', max_bytes=10, what="test body")


@pytest.mark.parametrize("bad", [b"", b"{", b"\xff\xfe", b'{"a": }', b"[1,]"])
def test_invalid_json_is_a_typed_error(bad: bytes) -> None:
    with pytest.raises(UntrustedJsonError) as e:
        loads_untrusted(bad)
    assert e.value.status_code == 400 and e.value.code == "invalid_json"


def test_nested_bomb_with_raised_recursion_limit_does_not_crash() -> None:
    """The attack: eth-account raises the recursion limit to 100000, then ~95k nested brackets
    overflow the C stack inside json.loads (SIGSEGV). Run it in a child so a crash is visible
    as a return code instead of killing the test runner."""
    code = (
        "import sys, eth_account\n"  # the import that raises the limit
        "assert sys.getrecursionlimit() >= 100000, sys.getrecursionlimit()\n"
        "from verinfer.protocol.jsonsafe import loads_untrusted, UntrustedJsonError\n"
        "bomb = b'[' * 190000 + b']' * 190000\n"
        "try:\n"
        "    loads_untrusted(bomb)\n"
        "except UntrustedJsonError as e:\n"
        "    print('refused:', e)\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, (r.returncode, r.stderr[-2000:])
    assert "refused:" in r.stdout and "nesting depth" in r.stdout
