"""Elementwise overloads no OpInfo sample reaches (a Scalar ``self``, fused and forward-mode
kernels, rrelu's noise), each compared with PyTorch CPU on the same call."""

from __future__ import annotations

import pytest
import torch

import torch_tpu  # noqa: F401

from .cases import assert_build_matches_cpu

aten = torch.ops.aten


def _x(*shape, dtype=torch.float32, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


def _ints(*shape, low=-8, high=9, dtype=torch.int64, seed=0):
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(low, high, shape, generator=generator).to(dtype)


def _shifts(dtype=torch.int32):
    # past the bit width and negative: PyTorch defines both (0, or the sign for >>)
    return torch.tensor([0, 1, 5, 31, 32, 40, -1], dtype=dtype)


def _shifted_in_place(x, other, left):
    if left:
        x <<= other
    else:
        x >>= other
    return x


CASES = {
    "bitwise_and.Scalar_Tensor": lambda d: aten.bitwise_and.Scalar_Tensor(6, _ints(7).to(d)),
    "bitwise_or.Scalar_Tensor": lambda d: aten.bitwise_or.Scalar_Tensor(6, _ints(7).to(d)),
    "bitwise_xor.Scalar_Tensor": lambda d: aten.bitwise_xor.Scalar_Tensor(
        True, _ints(7, low=0, high=2, dtype=torch.bool).to(d)
    ),
    "bitwise_left_shift.Tensor_Scalar": lambda d: aten.bitwise_left_shift.Tensor_Scalar(
        _ints(7, dtype=torch.int8).to(d), 3
    ),
    "bitwise_left_shift.Scalar_Tensor": lambda d: aten.bitwise_left_shift.Scalar_Tensor(-3, _shifts().to(d)),
    "bitwise_right_shift.Tensor_Scalar": lambda d: aten.bitwise_right_shift.Tensor_Scalar(
        _ints(7, dtype=torch.int16).to(d), 2
    ),
    "bitwise_right_shift.Scalar_Tensor": lambda d: aten.bitwise_right_shift.Scalar_Tensor(
        -100, _shifts().to(d)
    ),
    "__lshift__.Scalar": lambda d: _ints(7, dtype=torch.uint8, low=0).to(d) << 3,
    "__lshift__.Tensor": lambda d: _ints(7, dtype=torch.int32).to(d) << _shifts().to(d),
    "__rshift__.Scalar": lambda d: _ints(7).to(d) >> 1,
    "__rshift__.Tensor": lambda d: _ints(7, dtype=torch.int32).to(d) >> _shifts().to(d),
    "__ilshift__.Scalar": lambda d: _shifted_in_place(_ints(7, dtype=torch.int16).to(d), 3, True),
    "__ilshift__.Tensor": lambda d: _shifted_in_place(
        _ints(7, dtype=torch.int32).to(d), _shifts().to(d), True
    ),
    "__irshift__.Scalar": lambda d: _shifted_in_place(_ints(7, dtype=torch.int8).to(d), 2, False),
    "__irshift__.Tensor": lambda d: _shifted_in_place(
        _ints(7, dtype=torch.int32).to(d), _shifts().to(d), False
    ),
    "copysign.Scalar": lambda d: aten.copysign.Scalar(_x(6).to(d), -0.0),
    "copysign.Scalar int": lambda d: aten.copysign.Scalar(_ints(6).to(d), -2),
    "xlogy.Scalar_Self": lambda d: aten.xlogy.Scalar_Self(2.5, _x(6).abs().to(d)),
    "xlogy.Scalar_Other": lambda d: aten.xlogy.Scalar_Other(
        torch.tensor([0.0, 1.5, float("nan"), -2.0]).to(d), 0.0
    ),
    "remainder.Scalar_Tensor": lambda d: aten.remainder.Scalar_Tensor(5, _ints(7).clamp(min=1).to(d)),
    "remainder.Scalar_Tensor float": lambda d: 5.5 % _x(7).to(d),
    "isin.Tensor_Scalar": lambda d: aten.isin.Tensor_Scalar(_ints(8).to(d), 3, invert=True),
    "isin.Scalar_Tensor": lambda d: aten.isin.Scalar_Tensor(3, _ints(8).to(d)),
    "isin.Tensor_Tensor empty": lambda d: torch.isin(_ints(4).to(d), torch.empty(0, dtype=torch.long).to(d)),
    "_add_relu.Tensor": lambda d: aten._add_relu.Tensor(_x(6).to(d), _x(6, seed=1).to(d), alpha=2),
    "_add_relu.Scalar": lambda d: aten._add_relu.Scalar(_ints(6).to(d), -2),
    "fill.Tensor": lambda d: aten.fill.Tensor(_ints(2, 3).to(d), torch.tensor(2.7).to(d)),
    "fill.Scalar bool": lambda d: aten.fill.Scalar(_x(4).to(d), True),
    "logit_backward no eps": lambda d: aten.logit_backward.default(
        _x(6).to(d), torch.tensor([-0.5, 0.0, 0.25, 0.5, 1.0, 1.5]).to(d)
    ),
    "logit_backward eps": lambda d: aten.logit_backward.default(
        _x(6).to(d), torch.tensor([-0.5, 0.0, 0.05, 0.5, 1.0, 0.95]).to(d), 0.1
    ),
    "rrelu_with_noise_functional eval": lambda d: aten.rrelu_with_noise_functional.default(
        _x(3, 4).to(d), _x(3, 4, seed=1).to(d), 0.1, 0.3, False
    ),
    "rrelu_with_noise_ eval": lambda d: torch.nn.functional.rrelu(
        _x(6).to(d), 0.1, 0.3, training=False, inplace=True
    ),
    "rrelu_with_noise_backward eval": lambda d: aten.rrelu_with_noise_backward.default(
        _x(5).to(d), _x(5, seed=1).to(d), torch.ones(5).to(d), 0.1, 0.3, False, False
    ),
    "rrelu_with_noise_backward training": lambda d: aten.rrelu_with_noise_backward.default(
        _x(5).to(d), _x(5, seed=1).to(d), _x(5, seed=2).abs().to(d), 0.1, 0.3, True, False
    ),
    "glu_jvp": lambda d: aten.glu_jvp.default(
        torch.nn.functional.glu(_x(3, 4), 1).to(d), _x(3, 4).to(d), _x(3, 4, seed=1).to(d), 1
    ),
    "glu_backward_jvp": lambda d: aten.glu_backward_jvp.default(
        _x(4, 2, seed=1).to(d),
        _x(2, 2, seed=2).to(d),
        _x(4, 2).to(d),
        _x(2, 2, seed=3).to(d),
        _x(4, 2, seed=4).to(d),
        0,
    ),
    "softshrink_backward": lambda d: aten.softshrink_backward.default(
        _x(6).to(d), torch.tensor([-0.6, -0.5, 0.0, 0.5, 0.51, float("nan")]).to(d), 0.5
    ),
    "hardshrink half lambda rounding": lambda d: torch.nn.functional.hardshrink(
        torch.tensor([0.29, 0.3, 0.31, -0.3]).half().to(d), 0.3
    ),
}


@pytest.mark.parametrize("name", list(CASES))
def test_overload_matches_cpu(name):
    assert_build_matches_cpu(CASES[name])


def test_add_relu_rejects_what_cpu_rejects():
    half = _x(3, dtype=torch.float16)
    with pytest.raises(RuntimeError):
        aten._add_relu.Tensor(half, half)
    with pytest.raises(RuntimeError):
        aten._add_relu.Tensor(half.to("tpu"), half.to("tpu"))


def test_rrelu_training_samples_slopes_in_range_for_non_positive_inputs():
    x = torch.cat([-_x(500).abs(), _x(500).abs(), torch.zeros(1)]).to("tpu")
    output, noise = aten.rrelu_with_noise_functional.default(x, torch.empty_like(x), 0.1, 0.3, True)
    x, output, noise = x.cpu(), output.cpu(), noise.cpu()
    negative = x <= 0
    assert noise.dtype == x.dtype and output.dtype == x.dtype
    assert ((noise[negative] >= 0.1) & (noise[negative] <= 0.3)).all()
    assert noise[negative].std() > 0.03  # drawn, not one constant slope
    assert (noise[~negative] == 1).all()
    torch.testing.assert_close(output, x * noise)


def test_functional_rrelu_updates_noise_in_training():
    """F.rrelu reaches rrelu_with_noise, which writes the sampled slopes into its noise."""
    x = -_x(64).abs().to("tpu").requires_grad_()
    output = torch.nn.functional.rrelu(x, 0.2, 0.4, training=True)
    (grad,) = torch.autograd.grad(output, x, torch.ones_like(output))
    slopes = (output / x).detach().cpu()
    assert ((slopes >= 0.2 - 1e-6) & (slopes <= 0.4 + 1e-6)).all()
    torch.testing.assert_close(grad.cpu(), slopes)  # d(x * slope)/dx is the sampled slope
    eval_output = torch.nn.functional.rrelu(x.detach(), 0.2, 0.4, training=False)
    expected = torch.nn.functional.rrelu(x.detach().cpu(), 0.2, 0.4)
    torch.testing.assert_close(eval_output.cpu(), expected)


def test_conj_physical_in_place_matches_cpu():
    z = torch.complex(_x(5), _x(5, seed=1))
    tpu = z.to("tpu")
    assert tpu.conj_physical_() is tpu
    torch.testing.assert_close(tpu.cpu(), z.conj_physical())
    real = _x(3).to("tpu")
    torch.testing.assert_close(real.conj_physical_().cpu(), _x(3))
