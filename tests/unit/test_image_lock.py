"""scripts/image-lock: what the image build does when the Debian archive moves past
deploy/image/debian.lock (docs/deploy.md, "what the image promises"): a development or test
build warns with the diff and goes on, a --release build refuses, `write` refreshes the lock."""

from __future__ import annotations

import subprocess
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "image-lock"
HEADER = "# Debian bookworm packages in the verinfer image (name=version, sorted).\n"


def _run(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(SCRIPT), *map(str, args)], capture_output=True, text=True,
                          timeout=30)


def _files(tmp_path: Path, locked: str, actual: str) -> tuple[Path, Path]:
    lock, got = tmp_path / "debian.lock", tmp_path / "actual"
    lock.write_text(HEADER + locked)
    got.write_text(actual)
    return lock, got


def test_equal_sets_pass_silently_in_both_modes(tmp_path: Path) -> None:
    lock, got = _files(tmp_path, "a=1\nb=2\n", "a=1\nb=2\n")
    for mode in ([], ["--release"]):
        r = _run("compare", *mode, lock, got)
        assert r.returncode == 0 and r.stderr == ""


def test_drift_warns_with_the_diff_and_goes_on(tmp_path: Path) -> None:
    lock, got = _files(tmp_path, "libpam0g=1.5.2-6+deb12u1\nperl=5.36\n",
                       "libpam0g=1.5.2-6+deb12u3\nperl=5.36\n")
    r = _run("compare", lock, got)
    assert r.returncode == 0
    assert "-libpam0g=1.5.2-6+deb12u1" in r.stderr and "+libpam0g=1.5.2-6+deb12u3" in r.stderr
    assert "WARNING" in r.stderr and "1 package version(s)" in r.stderr


def test_a_release_build_refuses_drift(tmp_path: Path) -> None:
    lock, got = _files(tmp_path, "a=1\n", "a=1\nnew=3\n")
    r = _run("compare", "--release", lock, got)
    assert r.returncode == 1
    assert "+new=3" in r.stderr and "release build refuses drift" in r.stderr


def test_write_refreshes_the_lock_so_it_compares_equal(tmp_path: Path) -> None:
    lock, got = _files(tmp_path, "a=1\n", "a=2\nb=1\n")
    assert _run("write", got, lock).returncode == 0
    assert lock.read_text().startswith(HEADER)
    assert _run("compare", "--release", lock, got).returncode == 0


def test_bad_usage_is_exit_2(tmp_path: Path) -> None:
    assert _run("compare").returncode == 2
    assert _run("compare", tmp_path / "missing", tmp_path / "also").returncode == 2
    assert _run("frobnicate").returncode == 2
