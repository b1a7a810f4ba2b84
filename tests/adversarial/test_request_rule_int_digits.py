"""A user makes an honest operator's receipt nonconformant through the interpreter's
integer-length setting.

CPython refuses integer literals longer than ``sys.get_int_max_str_digits()``: 4300 by default,
but 0 (unlimited) or any value >= 640 through ``PYTHONINTMAXSTRDIGITS`` / ``-X
int_max_str_digits``. The request rule left that to the interpreter, so its answer for one body
depended on how the process was started: a chat body with a 5,000-digit ``max_tokens`` beside
``max_completion_tokens`` (which wins, so max_tokens is never read) was served by an operator
started with the limit off and refused (unreadable JSON) by a verifier with the default, which
then voted ``request_nonconformant``: an honest operator slashed by a request. Fix: the bounded
parser has its own integer limit (``verinfer.protocol.jsonsafe.MAX_INT_DIGITS``), below any
value CPython allows, so every process reads every body alike.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

RULE = """
import json, sys
from verinfer.protocol.request_rule import parse_body
body = sys.stdin.buffer.read()
try:
    parse_body(body, "chat")
    print("served")
except Exception as e:
    print("refused:" + type(e).__name__)
"""
BODY = (b'{"model":"m","messages":[{"role":"user","content":"hi"}],'
        b'"max_completion_tokens":4,"max_tokens":' + b"7" * 5000 + b"}")


def _rule_in_a_process(int_digits: str | None) -> str:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONINTMAXSTRDIGITS"}
    if int_digits is not None:
        env["PYTHONINTMAXSTRDIGITS"] = int_digits
    out = subprocess.run([sys.executable, "-c", RULE], input=BODY, capture_output=True,
                         env=env, timeout=120, check=True)
    return out.stdout.decode().strip()


@pytest.mark.parametrize("setting", ["0", "640", "100000"])
def test_the_rule_reads_a_body_alike_whatever_the_interpreters_int_limit(setting: str) -> None:
    assert _rule_in_a_process(setting) == _rule_in_a_process(None)


def test_the_long_integer_is_refused_everywhere() -> None:
    assert _rule_in_a_process("0") == "refused:UntrustedJsonError"
