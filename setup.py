"""Builds the fixed-order kernel library at install time (pip install --no-build-isolation -e .).

Flags matter for determinism: no fast-math and no FMA contraction, so every float operation in
csrc/ is exactly the one written there, on every ISA path.

Kernel cache (scripts/bootstrap only): when $VERINFER_KERNEL_CACHE names a directory, the
compiled library is looked up there under a hash of everything that decides its bytes — the
files of csrc/, this file, the compiler flags, the compiler's version, torch's and Python's
versions — and compiled only on a miss (then stored), so a second clone on the same machine
does not recompile. Paths are mapped away (-ffile-prefix-map), so the library's bytes do not
depend on where the checkout lives and a cached copy is the one a compile would give. Without
the variable (scripts/build-image, a plain pip install) nothing is looked up.
"""

from __future__ import annotations

import hashlib
import os
import platform
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
SOURCES = ["csrc/verinfer_kernels.cpp", "csrc/verinfer_sampling.cpp", "csrc/verinfer_fused.cpp"]
COMPILE_ARGS = [
    "-O3",
    "-ffp-contract=off",
    "-fno-fast-math",
    "-std=c++17",
    # -fopenmp: at::parallel_for is an inline OpenMP region in ATen's headers; without it
    # the kernels silently run on one thread. GOMP symbols resolve to torch's libgomp.
    "-fopenmp",
    # no debug info (Python's own CFLAGS add -g): GCC's code does not depend on -g,
    # and the kernels compile in about half the time without it
    "-g0",
]
# The checkout's path (and the .venv's torch headers below it) is written as this one, so
# the bytes are the same in every clone (and equal to a cached copy).
PREFIX_MAP = "-ffile-prefix-map={root}=/usr/src/verinfer"
LOG = "verinfer-kernels:"  # scripts/bootstrap shows pip's output lines that start with this


def kernel_key(files: dict[str, bytes], flags: list[str], compiler_version: str,
               toolchain: dict[str, str]) -> str:
    """sha256 over what decides the compiled library's bytes: source files (name and bytes),
    the flags in order, the compiler's version text, and the rest of the toolchain
    (torch, Python, platform). No path of the checkout enters it."""
    h = hashlib.sha256(b"verinfer-kernels/1\0")
    for name in sorted(files):
        h.update(f"file {name} {len(files[name])}\0".encode())
        h.update(files[name])
    for part in [f"flag {f}" for f in flags] + [f"compiler {compiler_version}"] + [
            f"{k} {toolchain[k]}" for k in sorted(toolchain)]:
        h.update(part.encode() + b"\0")
    return h.hexdigest()


def _key_inputs(root: Path) -> dict[str, bytes]:
    files = {p.relative_to(root).as_posix(): p.read_bytes()
             for p in sorted((root / "csrc").rglob("*")) if p.is_file()}
    files["setup.py"] = (root / "setup.py").read_bytes()
    return files


def _toolchain() -> dict[str, str]:
    import torch

    return {
        "torch": f"{torch.__version__} {torch.version.git_version}",
        "python": sys.version,
        "ext_suffix": str(sysconfig.get_config_var("EXT_SUFFIX")),
        "sysconfig_cflags": str(sysconfig.get_config_var("CFLAGS")),
        "ldshared": str(sysconfig.get_config_var("LDSHARED")),
        "machine": platform.machine(),
        "env": " ".join(f"{v}={os.environ.get(v, '')}" for v in
                        ("CC", "CXX", "CFLAGS", "CXXFLAGS", "CPPFLAGS", "LDFLAGS")),
    }


def _compiler_version() -> str:
    out = []
    for cmd in (os.environ.get("CXX", "c++"), os.environ.get("CC", "cc")):
        out.append(subprocess.run([cmd, "--version"], capture_output=True, text=True,
                                  check=True).stdout)
    return "\n".join(out)


def _log(msg: str) -> None:
    print(f"{LOG} {msg}", file=sys.stderr, flush=True)


if __name__ == "__main__":  # run by pip's build backend; tests import kernel_key alone
    from setuptools import setup
    from torch.utils.cpp_extension import BuildExtension, CppExtension

    class CachedBuildExtension(BuildExtension):
        def build_extension(self, ext) -> None:  # type: ignore[no-untyped-def]
            cache = os.environ.get("VERINFER_KERNEL_CACHE")
            if not cache:
                super().build_extension(ext)
                return
            key = kernel_key(_key_inputs(HERE), COMPILE_ARGS + [PREFIX_MAP],
                             _compiler_version(), _toolchain())
            entry = Path(cache).expanduser() / key
            target = Path(self.get_ext_fullpath(ext.name))
            cached = entry / target.name
            if cached.is_file():
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(cached, target)
                _log(f"cache hit {entry} (no compile)")
                return
            _log(f"cache miss {key[:16]}: compiling {len(ext.sources)} files "
                 "(several minutes on 2 cores)")
            super().build_extension(ext)
            entry.parent.mkdir(parents=True, exist_ok=True)
            tmp = Path(tempfile.mkdtemp(prefix=f".{key[:16]}.", dir=entry.parent))
            shutil.copyfile(target, tmp / target.name)
            try:
                tmp.rename(entry)  # atomic: another bootstrap may have stored it meanwhile
            except OSError:
                shutil.rmtree(tmp, ignore_errors=True)
            _log(f"compiled; stored in {entry}")

    setup(
        ext_modules=[
            CppExtension(
                name="verinfer._kernels",
                sources=SOURCES,
                extra_compile_args=COMPILE_ARGS + [PREFIX_MAP.format(root=HERE)],
            )
        ],
        cmdclass={"build_ext": CachedBuildExtension},
    )
