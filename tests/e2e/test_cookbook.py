"""docs/cookbook.md runs: its ```sh and ```python blocks, in order, against the session's
auditor devnet (tests/support/cookbook.py), so a cookbook that drifts from the code fails."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from support.cookbook import ROOT, AuditNet, audit_net, code_blocks, run_block

COOKBOOK = ROOT / "docs" / "cookbook.md"


@pytest.fixture(scope="module")
def net(request: pytest.FixtureRequest) -> AuditNet:
    return audit_net(request.config)


def test_extractor_reads_fences_and_no_run_marks() -> None:
    md = "x\n```sh\necho a\n```\n```python\nprint(1)\n```\n```sh no-run\nrm -rf /\n```\n" \
         "```text\nnot code\n```\n"
    blocks = code_blocks(md)
    assert [(b.lang, b.run, b.line) for b in blocks] == [("sh", True, 2), ("python", True, 5),
                                                         ("sh", False, 8)]
    assert blocks[0].code == "echo a\n"


def test_a_reader_sets_every_variable_the_blocks_read() -> None:
    """The page's own blocks (shown, not run: the fixture sets the same variables) set every
    variable of its table for a reader on the devnet (issue 38: SERVED_MODEL was never set,
    RECEIPT_ID, RESPONSE_FILE and APP_KEY had to be guessed); only the escalation example's
    tampered receipt comes from elsewhere (the page says from where)."""
    text = COOKBOOK.read_text()
    stated = set(re.findall(r"^\| `([A-Z_]+)` \|", text, re.M))
    set_by_reader = {v for b in code_blocks(text) if b.lang == "sh" and not b.run
                     for v in re.findall(r"(?:^|\s)([A-Z_]+)=", b.code, re.M)}
    assert stated - set_by_reader == {"TAMPERED_RECEIPT"}, stated - set_by_reader


def test_every_cookbook_block_runs_against_the_devnet(net: AuditNet, tmp_path: Path) -> None:
    text = COOKBOOK.read_text()
    blocks = code_blocks(text)
    env = net.env()
    # the page states every variable its blocks read, and the fixture sets each of them
    stated = set(re.findall(r"^\| `([A-Z_]+)` \|", text, re.M))
    used = {v for b in blocks if b.run for v in re.findall(r"\$\{?([A-Z_]{3,})\b|"
                                                           r"environ\[\"([A-Z_]+)\"\]", b.code)
            for v in v if v} - {"VERINFER_CHAIN_PRIVATE_KEY", "VERINFER_KERNEL_ISA"}
    assert used <= stated <= set(env), (used - stated, stated - set(env))
    ran = [b for b in blocks if b.run]
    assert len(ran) >= 12 and {b.lang for b in ran} == {"sh", "python"}
    ns: dict[str, Any] = {}
    outputs = [run_block(b, tmp_path, env, ns) for b in ran]
    assert any("mismatch at step" in o for o in outputs)  # the escalation example
    assert (tmp_path / "challenge.json").exists()
