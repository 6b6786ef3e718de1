"""``torch.set_float32_matmul_precision``: every mode builds its programs under the setting of
the moment and never reuses one built under another (XLA:CPU computes all settings alike, so
the programs' text is what shows it)."""

from __future__ import annotations

import re

import pytest
import torch

import torch_tpu
from torch_tpu import execution
from torch_tpu.runtime import platform


@pytest.fixture
def setting():
    before = torch.get_float32_matmul_precision()
    yield torch.set_float32_matmul_precision
    torch.set_float32_matmul_precision(before)


def _fused_text(fn) -> str:
    with torch_tpu.eager_mode("fused"):
        results = fn()  # kept alive: the graph computes only what is still referenced
        text = execution.pending_stablehlo()
        torch_tpu.sync()
    del results
    return text


@pytest.mark.parametrize("name, expected", [("highest", "HIGHEST"), ("high", "HIGH"), ("medium", "DEFAULT")])
def test_a_fused_graph_is_built_under_the_setting(setting, name, expected):
    a, b = torch.randn(4, 8, device="tpu"), torch.randn(8, 3, device="tpu")
    setting(name)
    text = _fused_text(lambda: a @ b)
    assert re.search(rf"precision = \[{expected}, {expected}\]", text), text


def test_float64_and_convolutions_keep_full_precision(setting):
    a = torch.randn(4, 8, device="tpu", dtype=torch.float64)
    x, w = torch.randn(1, 2, 5, 5, device="tpu"), torch.randn(3, 2, 3, 3, device="tpu")
    setting("medium")
    text = _fused_text(lambda: (a @ a.T, torch.nn.functional.conv2d(x, w)))
    precisions = re.findall(r"precision(?:_config)? = \[([^\]]*)\]", text)
    assert len(precisions) == 2 and all("HIGHEST" in p and "DEFAULT" not in p for p in precisions), text


def test_a_strict_op_compiles_again_for_a_new_setting_and_reuses_the_old_one(setting):
    a, b = torch.randn(5, 7, device="tpu"), torch.randn(7, 3, device="tpu")
    expected = (a.cpu() @ b.cpu()).numpy()

    def built_by(fn) -> int:
        before = platform.compile_events["executables_built"]
        fn()
        return platform.compile_events["executables_built"] - before

    setting("highest")
    (a @ b).cpu()
    assert built_by(lambda: (a @ b).cpu()) == 0
    setting("high")
    assert built_by(lambda: (a @ b).cpu()) > 0  # not the "highest" program
    setting("highest")
    assert built_by(lambda: (a @ b).cpu()) == 0
    torch.testing.assert_close((a @ b).cpu().numpy(), expected)


def test_a_compiled_function_is_rebuilt_for_a_new_setting(setting):
    step = torch.compile(lambda x, y: (x @ y).relu(), backend="tpu")
    x, y = torch.randn(6, 4, device="tpu"), torch.randn(4, 2, device="tpu")
    setting("highest")
    step(x, y).cpu()
    graphs = torch.tpu.compilation_cache_stats()["compiled_graphs"]
    step(x, y).cpu()
    assert torch.tpu.compilation_cache_stats()["compiled_graphs"] == graphs
    setting("medium")
    step(x, y).cpu()
    assert torch.tpu.compilation_cache_stats()["compiled_graphs"] == graphs + 1
