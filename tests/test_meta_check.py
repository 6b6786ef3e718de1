"""TORCH_TPU_CHECK_META: every tpu kernel call checked against PyTorch's Meta kernel (shapes,
dtypes, strides of what it returns and writes; the errors PyTorch raises). Real ops pass it, and
deliberately wrong kernels are caught."""

from __future__ import annotations

import pytest
import torch

from torch_tpu.ops import meta_check
from torch_tpu.ops.meta_check import MetaMismatch, checked
from torch_tpu.runtime.flags import flags

TPU = torch.device("tpu")
aten = torch.ops.aten


@pytest.fixture
def check_meta(monkeypatch):
    monkeypatch.setattr(flags, "check_meta", True)


def test_switch_is_read_from_the_environment(run_python):
    code = "from torch_tpu.runtime.flags import flags; print(flags.check_meta)"
    assert run_python(code, TORCH_TPU_CHECK_META="1").strip() == "True"
    assert run_python(code, TORCH_TPU_CHECK_META="0").strip() == "False"


def _x(*shape, dtype=torch.float32):
    return torch.arange(float(torch.Size(shape).numel())).reshape(shape).to(dtype).to(TPU)


# One of each kernel kind (functional, derived in-place and out=, runtime: factory, view, copy),
# including layouts PyTorch does not make contiguous.
REAL_OPS = {
    "binary": lambda: _x(2, 3) + _x(3),
    "transposed_elementwise": lambda: _x(3, 4).t() * 2,
    "channels_last_elementwise": lambda: torch.sigmoid(
        _x(2, 3, 4, 5).contiguous(memory_format=torch.channels_last)
    ),
    "comparison": lambda: _x(3, 4).t() > 2,
    "mm": lambda: _x(5, 2) @ _x(2, 3),
    "reduction": lambda: _x(3, 4).sum(dim=1, keepdim=True),
    "cat": lambda: torch.cat([_x(2, 3), _x(1, 3)]),
    "in_place": lambda: _x(3, 4).t().add_(1),
    "out": lambda: torch.mul(_x(2, 3), 2, out=torch.empty(0, device=TPU)),
    "factory": lambda: torch.zeros(2, 3, device=TPU, dtype=torch.int32),
    "empty_channels_last": lambda: torch.empty(2, 3, 4, 5, device=TPU, memory_format=torch.channels_last),
    "view": lambda: _x(3, 4).t().reshape(2, 6),
    "to_dtype": lambda: _x(3, 4).t().to(torch.float64),
    "to_cpu": lambda: _x(3, 4).t().cpu(),
}


@pytest.mark.parametrize("name", REAL_OPS)
def test_real_ops_pass(check_meta, name):
    REAL_OPS[name]()


def test_every_kernel_kind_is_checked(check_meta, monkeypatch):
    seen = []
    original = meta_check._checked_call

    def spy(op, *rest):
        seen.append(op)
        return original(op, *rest)

    monkeypatch.setattr(meta_check, "_checked_call", spy)
    x = _x(3)
    x + 1  # functional
    x.add_(1)  # derived in-place
    torch.add(x, 1, out=torch.empty(3, device=TPU))  # derived out= (empty: a runtime kernel)
    assert {aten.add.Tensor, aten.add_.Tensor, aten.add.out, aten.empty.memory_format} <= set(seen)


def test_pytorch_errors_still_raise(check_meta):
    with pytest.raises(RuntimeError, match="mat1 and mat2 shapes cannot be multiplied"):
        _x(5, 1) @ _x(2, 3)


# ----------------------------------------------------------------------------- wrong kernels
def _pair(*shape):
    return lambda: (_x(*shape), _x(*shape))


# op, a wrong tpu kernel for it, its arguments, what the checker reports
WRONG_KERNELS = {
    "shape": (
        aten.add.Tensor,
        lambda a, b, alpha=1: torch.zeros(3, 2, device=TPU),
        _pair(2, 3),
        "output: shape",
    ),
    "dtype": (
        aten.add.Tensor,
        lambda a, b, alpha=1: torch.zeros(2, 3, device=TPU).long(),
        _pair(2, 3),
        "output: dtype",
    ),
    "strides": (
        aten.add.Tensor,
        lambda a, b, alpha=1: torch.zeros(2, 3, device=TPU),
        lambda: (_x(3, 2).t(), _x(3, 2).t()),
        "output: strides",
    ),
    "written_argument": (
        aten.add.out,
        lambda a, b, alpha=1, *, out: [out.resize_(6), a + b][1],
        _pair(2, 3),
        "argument 'out': shape",
    ),
    "accepts_bad_input": (
        aten.mm.default,
        lambda a, b: torch.zeros(5, 3, device=TPU),
        lambda: (_x(5, 1), _x(2, 3)),
        "accepted arguments PyTorch rejects",
    ),
    "wrong_error_type": (
        aten.mm.default,
        lambda a, b: [][0],
        lambda: (_x(5, 1), _x(2, 3)),
        "raised IndexError on tpu, PyTorch raises RuntimeError",
    ),
}


@pytest.mark.parametrize("op,kernel,args,message", WRONG_KERNELS.values(), ids=WRONG_KERNELS)
def test_wrong_kernels_are_caught(check_meta, op, kernel, args, message):
    kwargs = {"out": torch.empty(2, 3, device=TPU)} if op is aten.add.out else {}
    with pytest.raises(MetaMismatch, match=message):
        checked(op, kernel)(*args(), **kwargs)


def test_unchecked_when_switched_off(monkeypatch):
    monkeypatch.setattr(flags, "check_meta", False)
    wrong = checked(aten.add.Tensor, lambda a, b, alpha=1: torch.zeros(3, 2, device=TPU))
    assert wrong(_x(2, 3), _x(2, 3)).shape == (3, 2)
