"""The kernel cache key (setup.py, used by scripts/bootstrap): it changes with every input that
decides the compiled library's bytes, and not with where the checkout lives."""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]
TOOLCHAIN = {"torch": "2.13.0+cpu abc", "python": "3.11.7", "ext_suffix": ".so",
             "machine": "x86_64"}


def _setup_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("verinfer_setup", ROOT / "setup.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # setup() runs only as __main__ (pip's build backend)
    return module


def test_key_follows_sources_flags_compiler_and_toolchain() -> None:
    s = _setup_module()
    files = {"csrc/a.cpp": b"int a;", "csrc/b.h": b"#pragma once", "setup.py": b"x"}
    flags = [*list(s.COMPILE_ARGS), s.PREFIX_MAP]
    base = s.kernel_key(files, flags, "g++ 12.2.0", TOOLCHAIN)
    assert base == s.kernel_key(dict(reversed(list(files.items()))), flags, "g++ 12.2.0",
                                TOOLCHAIN)
    changed = [
        s.kernel_key({**files, "csrc/a.cpp": b"int b;"}, flags, "g++ 12.2.0", TOOLCHAIN),
        s.kernel_key({**files, "csrc/b.h": b"#pragma once "}, flags, "g++ 12.2.0", TOOLCHAIN),
        s.kernel_key({**files, "csrc/c.h": b""}, flags, "g++ 12.2.0", TOOLCHAIN),
        s.kernel_key(files, [f for f in flags if f != "-ffp-contract=off"], "g++ 12.2.0",
                     TOOLCHAIN),
        s.kernel_key(files, flags[::-1], "g++ 12.2.0", TOOLCHAIN),
        s.kernel_key(files, flags, "g++ 12.3.0", TOOLCHAIN),
        s.kernel_key(files, flags, "g++ 12.2.0", {**TOOLCHAIN, "torch": "2.13.1+cpu abc"}),
        # a byte moved from one file's end to the next one's start
        s.kernel_key({**files, "csrc/a.cpp": b"int a", "csrc/b.h": b";#pragma once"}, flags,
                     "g++ 12.2.0", TOOLCHAIN),
    ]
    assert base not in changed and len(set(changed)) == len(changed)


def test_key_inputs_do_not_depend_on_the_checkout_path(tmp_path: Path) -> None:
    s = _setup_module()
    keys = []
    for where in ("one", "elsewhere/two"):
        clone = tmp_path / where
        shutil.copytree(ROOT / "csrc", clone / "csrc")
        shutil.copy(ROOT / "setup.py", clone / "setup.py")
        keys.append(s.kernel_key(s._key_inputs(clone), [*list(s.COMPILE_ARGS), s.PREFIX_MAP],
                                 "g++", TOOLCHAIN))
    assert keys[0] == keys[1]
    (tmp_path / "one" / "csrc" / "verinfer_pool.h").write_bytes(b"changed")
    assert s.kernel_key(s._key_inputs(tmp_path / "one"), [*list(s.COMPILE_ARGS), s.PREFIX_MAP],
                        "g++", TOOLCHAIN) != keys[0]
    # the compiled bytes do not name the checkout either: its path is mapped away
    assert s.PREFIX_MAP.format(root=tmp_path / "one") == \
        f"-ffile-prefix-map={tmp_path / 'one'}=/usr/src/verinfer"


def test_the_image_build_never_reads_the_host_kernel_cache() -> None:
    build_image = (ROOT / "scripts" / "build-image").read_text()
    assert "unset VERINFER_KERNEL_CACHE" in build_image
