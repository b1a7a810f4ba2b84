"""Builds the fixed-order kernel library at install time (pip install --no-build-isolation -e .).

Flags matter for determinism: no fast-math and no FMA contraction, so every float operation in
csrc/ is exactly the one written there, on every ISA path.
"""

from setuptools import setup
from torch.utils.cpp_extension import BuildExtension, CppExtension

setup(
    ext_modules=[
        CppExtension(
            name="verinfer._kernels",
            sources=["csrc/verinfer_kernels.cpp", "csrc/verinfer_sampling.cpp",
                     "csrc/verinfer_fused.cpp"],
            # -fopenmp: at::parallel_for is an inline OpenMP region in ATen's headers; without it
            # the kernels silently run on one thread. GOMP symbols resolve to torch's libgomp.
            extra_compile_args=[
                "-O3",
                "-ffp-contract=off",
                "-fno-fast-math",
                "-std=c++17",
                "-fopenmp",
                # no debug info (Python's own CFLAGS add -g): GCC's code does not depend on -g,
                # and the kernels compile in about half the time without it
                "-g0",
            ],
        )
    ],
    cmdclass={"build_ext": BuildExtension},
)
