"""The Python names the C++ core reaches by string (csrc/runtime/PythonNames.h) exist, and a
missing one is named at initialization."""

import pytest

import torch_tpu
from torch_tpu.runtime import native

pytestmark = pytest.mark.skipif(not native.available(), reason="the C++ runtime core is not built")


def test_every_name_the_core_reads_exists():
    torch_tpu._initialize()
    names = native._C.python_names()
    assert ("torch_tpu.runtime.flags.CoreFlags", "attention_needed") in names
    assert ("torch_tpu.runtime.callbacks", "synchronize") in names
    assert len(names) == len(set(names))
    native.check_python_names()


def test_a_missing_name_is_named(monkeypatch):
    torch_tpu._initialize()
    names = [*native._C.python_names(), ("torch_tpu.runtime.platform", "no_such_flag")]

    class Core:
        @staticmethod
        def python_names():
            return names

    monkeypatch.setattr(native, "_C", Core())
    with pytest.raises(RuntimeError, match=r"torch_tpu\.runtime\.platform\.no_such_flag"):
        native.check_python_names()
