"""The op table is strict, and in-place/out= variants come from the functional lowering."""

from __future__ import annotations

import pytest
import torch

import torch_tpu
from torch_tpu.ops import dispatch as _dispatch
from torch_tpu.ops.registry import LOWERINGS, lower

aten = torch.ops.aten


def test_duplicate_registration_is_an_error():
    before = LOWERINGS[aten.add.Tensor]
    with pytest.raises(RuntimeError, match="duplicate tpu lowering for aten.add.Tensor"):
        lower(aten.add.Tensor)(lambda x, y, alpha: x)
    assert LOWERINGS[aten.add.Tensor] is before


def test_purely_composite_ops_are_refused():
    with pytest.raises(RuntimeError, match="CompositeImplicitAutograd"):
        _dispatch.check_installable(aten.linear.default)
    _dispatch.check_installable(aten.addmm.default)  # has backend kernels: fine


def test_inplace_and_out_variants_are_derived_not_registered():
    assert _dispatch.DERIVED[aten.add_.Tensor] is aten.add.Tensor
    assert _dispatch.DERIVED[aten.add.out] is aten.add.Tensor
    assert _dispatch.DERIVED[aten.mul.out] is aten.mul.Tensor
    assert not set(_dispatch.DERIVED) & set(LOWERINGS)


def test_derived_variants_use_the_functional_lowering():
    reached = _dispatch.recorded_ops
    x = torch.arange(6.0, device="tpu")
    out = torch.empty(6, device="tpu")
    torch.add(x, 1.5, out=out)
    x.mul_(2)
    assert out.cpu().tolist() == [1.5, 2.5, 3.5, 4.5, 5.5, 6.5]
    assert x.cpu().tolist() == [0.0, 2.0, 4.0, 6.0, 8.0, 10.0]
    if reached is not None:
        assert {aten.add.Tensor, aten.mul.Tensor} <= reached


def test_out_variant_resizes_like_pytorch():
    out = torch.empty(0, device="tpu")
    torch.mul(torch.ones(2, 3, device="tpu"), 3, out=out)
    assert out.shape == (2, 3) and out.sum().item() == 18


def test_out_variant_resize_warns_at_the_callers_line_like_pytorch():
    for device in ("cpu", "tpu"):
        with pytest.warns(UserWarning, match="An output with one or more elements was resized") as record:
            torch.mul(torch.ones(2, 3, device=device), 3, out=torch.empty(4, device=device))
        assert {w.filename for w in record} == {__file__}, device


def test_out_variant_refuses_lossy_dtype():
    out = torch.empty(3, dtype=torch.int64, device="tpu")
    with pytest.raises(RuntimeError, match="result type Float can't be cast to the desired output type Long"):
        torch.add(torch.ones(3, device="tpu"), 1, out=out)


def test_lowered_ops_lists_the_table():
    names = torch_tpu.lowered_ops()
    assert "aten.add.Tensor" in names and "aten.add_.Tensor" not in names
    assert len(names) == len(LOWERINGS)
