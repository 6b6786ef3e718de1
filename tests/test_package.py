"""The package ships source and its declared data only."""

from __future__ import annotations

import pathlib

import torch_tpu

PACKAGE = pathlib.Path(torch_tpu.__file__).parent
DATA = {"demo/data/tiny_tales.txt", "agent/SKILL.md"}  # package data declared in pyproject.toml
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
