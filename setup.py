"""Builds torch_tpu's C++ runtime core (csrc/runtime) as ``torch_tpu._C``; everything else about
the package is in pyproject.toml. In a checkout: ``python setup.py build_ext --inplace``."""

import glob
import os

import torch
from setuptools import setup
from torch.utils.cpp_extension import BuildExtension, CppExtension

#: Kineto's headers, shipped in torch's wheel (TpuProfiler.cpp implements its activity profiler)
KINETO = os.path.join(os.path.dirname(torch.__file__), "include", "kineto")

setup(
    ext_modules=[
        CppExtension(
            "torch_tpu._C",
            # one file per concern, as OpenReg keeps them (Module.cpp makes the module)
            sorted(glob.glob("csrc/runtime/*.cpp")),
            include_dirs=[KINETO],
            define_macros=[("USE_KINETO", None)] if os.path.isdir(KINETO) else [],
            # nothing here is hot enough for -O2/-O3 to matter; -O1 keeps the build short
            extra_compile_args=["-O1", "-g0"],
        )
    ],
    cmdclass={"build_ext": BuildExtension.with_options(use_ninja=False)},
)
