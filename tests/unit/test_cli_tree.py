"""The `verinfer` command tree by user: `operator serve`, `verifier run|audit|challenge`, the
short aliases (`serve`, `audit`, `challenge`) that are the very same commands, `bench NAME`
from any directory, and a `--help` that imports none of the parts."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import typer
from typer import _click as click  # typer's own click, as verinfer.cli uses
from typer.core import TyperGroup
from typer.testing import CliRunner

import verinfer.cli as cli
from verinfer.cli import app

ROOT = Path(__file__).resolve().parents[2]
runner = CliRunner()


def _resolve(*path: str) -> click.Command:
    """The click command ``verinfer PATH...`` runs (lazy parts load here)."""
    cmd: click.Command = typer.main.get_group(app)
    ctx = click.Context(cmd)
    for name in path:
        assert isinstance(cmd, TyperGroup)
        sub = cmd.get_command(ctx, name)
        assert sub is not None, f"verinfer {' '.join(path)}: no {name!r}"
        cmd, ctx = sub, click.Context(sub, parent=ctx)
    return cmd


def test_help_lists_the_tree_without_importing_any_part() -> None:
    code = ("import sys\nfrom verinfer.cli import app\n"
            "try:\n    app(['--help'])\nexcept SystemExit:\n    pass\n"
            "loaded = [m for m in sys.modules if m.startswith('verinfer.') and m.endswith('cli')"
            " and m != 'verinfer.cli' or m in ('torch', 'web3')]\n"
            "print('LOADED', loaded)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, env={"COLUMNS": "120", "PATH": ""}).stdout
    for name in ("operator", "verifier", "serve", "audit", "challenge", "bench", "devnet"):
        assert f" {name} " in out, out
    assert "LOADED []" in out, out


@pytest.mark.parametrize(("alias", "path"), [
    (("serve",), ("operator", "serve")),
    (("audit",), ("verifier", "audit")),
    (("challenge",), ("verifier", "challenge")),
])
def test_alias_is_the_same_command(alias: tuple[str, ...], path: tuple[str, ...]) -> None:
    a, b = _resolve(*alias), _resolve(*path)
    assert a.help and a.help == b.help  # (typer wraps callbacks anew on each load)
    assert sorted(p.name or "" for p in a.params) == sorted(p.name or "" for p in b.params)
    assert getattr(a, "commands", {}).keys() == getattr(b, "commands", {}).keys()


def test_every_listed_command_loads() -> None:
    """The table names modules and commands as strings: a typo would only show on use."""
    for name, entry in cli._SUBCOMMANDS.items():
        subs = list(entry) if isinstance(entry, dict) else [None]
        for sub in subs:
            cmd = _resolve(name, *([sub] if sub else []))
            assert cmd.name == (sub or name)
    assert _resolve("verifier", "run").callback is not None


def test_operator_serve_refuses_a_serve_without_evidence_choice() -> None:
    # both spellings reach the same checks (no model is loaded before them)
    for argv in (["serve"], ["operator", "serve"]):
        r = runner.invoke(app, [*argv, "--model", "a", "--model", "b", "--name", "x"])
        assert r.exit_code == 2, r.output
        assert "--name applies to a single --model" in r.output


def _fake_repo(tmp_path: Path) -> Path:
    root = tmp_path / "repo"
    (root / "bench").mkdir(parents=True)
    (root / "pyproject.toml").write_text("")
    (root / "bench" / "hello.py").write_text(
        "import sys\nfrom pathlib import Path\n"
        "Path(sys.argv[1]).write_text(' '.join(sys.argv[2:]) + '|' + str(Path.cwd()))\n"
        "sys.exit(3)\n")
    return root


def test_bench_runs_a_script_from_any_directory(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    root = _fake_repo(tmp_path)
    monkeypatch.setattr(cli, "repository_root", lambda: root)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    out = tmp_path / "out.txt"
    r = runner.invoke(app, ["bench", "hello", str(out), "--rounds", "2"])
    assert r.exit_code == 3  # the script's own exit status
    assert out.read_text() == f"--rounds 2|{elsewhere}"  # its args; the caller's directory


def test_bench_refuses_unknown_names_and_paths(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    root = _fake_repo(tmp_path)
    (tmp_path / "evil.py").write_text("raise SystemExit(0)\n")
    monkeypatch.setattr(cli, "repository_root", lambda: root)
    for name in ("nope", "../evil", str(tmp_path / "evil.py"), "hello.py"):
        r = runner.invoke(app, ["bench", name])
        assert r.exit_code == 2 and "no benchmark" in r.output and "hello" in r.output


def test_bench_without_the_repository_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cli, "repository_root", lambda: None)
    r = runner.invoke(app, ["bench", "engine"])
    assert r.exit_code == 2 and "source repository" in r.output


def test_the_repository_root_is_found_from_the_package() -> None:
    assert cli.repository_root() == ROOT
    assert {"engine", "serve", "kms"} <= set(cli.bench_names(ROOT))
