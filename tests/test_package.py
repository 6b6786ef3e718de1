"""The package ships source and its declared data only, and the test suite can be collected on
its own (``pytest --collect-only``: the session's lowering gate applies to whole runs only)."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import torch_tpu

PACKAGE = pathlib.Path(torch_tpu.__file__).parent
ROOT = pathlib.Path(__file__).parent.parent
DATA = {"demo/data/tiny_tales.txt"}  # package data declared in pyproject.toml
EXTENSION = "_C.*.so"  # the C++ runtime core, built from csrc/runtime by setup.py


def test_package_holds_only_source_and_declared_data():
    stray = sorted(
        str(path.relative_to(PACKAGE))
        for path in PACKAGE.rglob("*")
        if path.is_file()
        and "__pycache__" not in path.parts
        and path.suffix != ".py"
        and str(path.relative_to(PACKAGE)) not in DATA
        and not (path.parent == PACKAGE and path.match(EXTENSION))
    )
    assert stray == []


def test_the_suite_collects_without_errors():
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "TORCH_TPU_REACHED"))}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:xdist", "tests"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "tests collected" in done.stdout
