"""Errors on tpu are PyTorch's errors: the same exception types as CPU (messages like CUDA's where
the device shows), raised before anything is written, after which the process keeps working.
Also the opt-in switches that change error behaviour: CPU fallback and debug (blocking) eager."""

from __future__ import annotations

import json
import re

import pytest
import torch

import torch_tpu

TPU = torch.device("tpu")
aten = torch.ops.aten
F = torch.nn.functional
SAME_DEVICE = "Expected all tensors to be on the same device"


def _cpu_and_tpu(*cpu_tensors: torch.Tensor):
    return cpu_tensors, tuple(t.to(TPU) for t in cpu_tensors)


def assert_raises_like_cpu(fn, *cpu_tensors: torch.Tensor) -> Exception:
    """``fn`` raises the same exception type on the tpu copies as on the CPU tensors, and leaves
    every argument unchanged. Returns the tpu exception."""
    cpu, tpu = _cpu_and_tpu(*cpu_tensors)
    with pytest.raises(Exception) as cpu_error:
        fn(*cpu)
    with pytest.raises(type(cpu_error.value)) as tpu_error:
        fn(*tpu)
    assert type(tpu_error.value) is type(cpu_error.value), (tpu_error.value, cpu_error.value)
    for before, after in zip(cpu_tensors, tpu):
        assert torch.equal(after.cpu(), before), "a failed op modified its argument"
    assert torch.equal((tpu[0] * 1).cpu(), cpu_tensors[0] * 1), "the process stopped working"
    return tpu_error.value


# ----------------------------------------------------------------------------- devices
MIXED = {
    "binary": lambda t, c: t + c,
    "binary_reversed": lambda t, c: c * t,
    "inplace_tpu_self": lambda t, c: t.add_(c),
    "inplace_cpu_self": lambda t, c: c.sub_(t),
    "out_on_cpu": lambda t, c: torch.add(t, t, out=c),
    "where": lambda t, c: torch.where(t > 0, t, c),
    "cat": lambda t, c: torch.cat([t, c]),
    "matmul": lambda t, c: t.view(2, 2) @ c.view(2, 2),
}


@pytest.mark.parametrize("name", MIXED)
def test_device_mismatch(name):
    tpu, cpu = torch.arange(4.0, device=TPU), torch.arange(4.0) + 10
    with pytest.raises(RuntimeError, match=SAME_DEVICE):
        MIXED[name](tpu, cpu)
    assert tpu.cpu().tolist() == [0.0, 1.0, 2.0, 3.0]
    assert cpu.tolist() == [10.0, 11.0, 12.0, 13.0]


def test_cpu_scalar_tensor_joins_device_ops():
    tpu = torch.arange(4.0, device=TPU)
    scalar = torch.tensor(2.5)
    assert (tpu * scalar).device.type == "tpu"
    assert (tpu * scalar).cpu().tolist() == [0.0, 2.5, 5.0, 7.5]
    assert torch.where(tpu > 1, tpu, scalar).cpu().tolist() == [2.5, 2.5, 2.0, 3.0]
    tpu.add_(torch.tensor(1))
    assert tpu.cpu().tolist() == [1.0, 2.0, 3.0, 4.0]


def test_host_only_scalar_argument_refuses_a_device_tensor():
    """``randint_like``'s tensor ``high`` is read on the host: PyTorch takes a CPU scalar only."""
    x = torch.zeros(3, device=TPU)
    with pytest.raises(RuntimeError, match="high must be a scalar tensor and on CPU"):
        aten.randint_like.Tensor(x, torch.tensor(4, device=TPU))
    assert aten.randint_like.Tensor(x, torch.tensor(4)).max().item() < 4


# ----------------------------------------------------------------------------- shapes and dtypes
SHAPE_ERRORS = {
    "broadcast": (lambda a, b: a + b, (torch.ones(3), torch.ones(4))),
    "inplace_broadcast": (lambda a, b: a.mul_(b), (torch.ones(3), torch.ones(2, 3))),
    "out_shape": (
        lambda a, b: torch.add(a, a, out=b.view(2, 2)[0].t().expand(3, 2)),
        (torch.ones(3, 2), torch.zeros(4)),
    ),
    "view": (lambda a: a.view(5), (torch.ones(12),)),
    "view_incompatible_strides": (lambda a: a.t().view(12), (torch.ones(3, 4),)),
    "copy_": (lambda a, b: a.copy_(b), (torch.ones(3), torch.ones(4))),
    "cat": (lambda a, b: torch.cat([a, b]), (torch.ones(2, 3), torch.ones(2, 4))),
    "mm": (lambda a, b: a @ b, (torch.ones(5, 1), torch.ones(2, 3))),
    "expand": (lambda a: a.expand(2, 4), (torch.ones(3),)),
    "reshape": (lambda a: a.reshape(-1, 5), (torch.ones(12),)),
}


@pytest.mark.parametrize("fn,args", SHAPE_ERRORS.values(), ids=SHAPE_ERRORS.keys())
def test_shape_errors_like_cpu(fn, args):
    assert_raises_like_cpu(fn, *args)


# Elementwise operands that do not broadcast: CPU's TensorIterator error, word for word (the
# meta kernels' Python references word it otherwise)
BROADCAST_ERRORS = {
    "add": (lambda a, b: a + b, (3,), (4,)),
    "mul_batched": (torch.mul, (2, 3), (4, 1, 2)),
    "where": (lambda a, b: torch.where(a > 0, a, b), (3,), (5,)),
    "addcmul": (lambda a, b: torch.addcmul(a, a, b), (3,), (4,)),
    "lerp": (lambda a, b: torch.lerp(a, b, 0.5), (3,), (4,)),
    "eq": (torch.eq, (3,), (4,)),
    "sub_out": (lambda a, b: torch.sub(a, b, out=torch.empty_like(a)), (3,), (4,)),
}


@pytest.mark.parametrize("mode", ["strict", "fused"])
@pytest.mark.parametrize(
    "fn,shapes", [(c[0], c[1:]) for c in BROADCAST_ERRORS.values()], ids=BROADCAST_ERRORS.keys()
)
def test_broadcast_errors_read_as_on_cpu(fn, shapes, mode):
    tensors = [torch.ones(shape) for shape in shapes]
    with pytest.raises(RuntimeError) as cpu_error:
        fn(*tensors)
    with torch_tpu.eager_mode(mode):
        tpu_error = assert_raises_like_cpu(fn, *tensors)
    assert str(tpu_error) == str(cpu_error.value)


# Products whose inner (or batch) sizes differ by a size-1 dimension, which einsum would broadcast
# (a 5x1 by 2x3 mm once returned a 5x3 tensor of 2s): CPU's exception and message.
PRODUCT_SIZE_ERRORS = {
    "mm": (torch.mm, (5, 1), (2, 3)),
    "matmul_batched": (torch.matmul, (2, 5, 1), (2, 3)),
    "matmul_vector": (torch.matmul, (5, 1), (3,)),
    "mv": (torch.mv, (5, 1), (3,)),
    "bmm_inner": (torch.bmm, (2, 5, 1), (2, 2, 3)),
    "bmm_batch": (torch.bmm, (1, 5, 2), (2, 2, 3)),
    "addmm": (lambda a, b, c: torch.addmm(a, b, c), (5, 3), (5, 1), (2, 3)),
    "addmm_inplace": (lambda a, b, c: a.addmm_(b, c), (5, 3), (5, 1), (2, 3)),
    "mm_out": (lambda a, b, c: torch.mm(b, c, out=a), (5, 3), (5, 1), (2, 3)),
    "addmv": (torch.addmv, (5,), (5, 1), (3,)),
    "addmv_input_length": (torch.addmv, (2,), (5, 3), (3,)),
    "baddbmm_inner": (torch.baddbmm, (2, 5, 3), (2, 5, 1), (2, 2, 3)),
    "baddbmm_batch": (torch.baddbmm, (5, 3), (1, 5, 2), (2, 2, 3)),
    "addbmm_inner": (torch.addbmm, (5, 3), (2, 5, 1), (2, 2, 3)),
    "addbmm_batch": (torch.addbmm, (5, 3), (1, 5, 2), (2, 2, 3)),
}


@pytest.mark.parametrize(
    "fn,shapes", [(c[0], c[1:]) for c in PRODUCT_SIZE_ERRORS.values()], ids=PRODUCT_SIZE_ERRORS.keys()
)
def test_product_size_errors_like_cpu(fn, shapes):
    cpu = [torch.ones(s) for s in shapes]
    with pytest.raises(RuntimeError) as cpu_error:
        fn(*cpu)
    error = assert_raises_like_cpu(fn, *cpu)
    assert str(error) == str(cpu_error.value)


CAST_ERRORS = {
    "int_iadd_float": (
        lambda a, b: a.__iadd__(b),
        (torch.arange(3), torch.ones(3)),
        "result type Float can't be cast to the desired output type Long",
    ),
    "int_add_float_scalar": (
        lambda a: a.add_(1.5),
        (torch.arange(3),),
        "result type Float can't be cast to the desired output type Long",
    ),
    "bool_add_int": (
        lambda a: a.add_(1),
        (torch.ones(3, dtype=torch.bool),),
        "result type Long can't be cast to the desired output type Bool",
    ),
    "float_out_into_int": (
        lambda a, b: torch.mul(a, a, out=b),
        (torch.ones(3), torch.zeros(3, dtype=torch.int32)),
        "result type Float can't be cast to the desired output type Int",
    ),
    # (CPU computes the loss in the target's dtype: 0/1 labels kept as integers refuse)
    # (embedding_bag's own check names the position; embedding's is an IndexError)
    "embedding_bag_index_outside": (
        lambda w, i, o: torch.nn.functional.embedding_bag(i, w, o),
        (torch.ones(10, 3), torch.tensor([1, 12, 3]), torch.tensor([0, 2])),
        "Index 1 of input takes value 12 which is not in the valid range [0, 10)",
    ),
    "bce_with_logits_int_target": (
        torch.nn.functional.binary_cross_entropy_with_logits,
        (torch.randn(4), torch.tensor([0, 1, 1, 0])),
        "result type Float can't be cast to the desired output type Long",
    ),
    "bce_with_logits_bool_target": (
        torch.nn.functional.binary_cross_entropy_with_logits,
        (torch.randn(4), torch.tensor([False, True, True, False])),
        "Subtraction, the `-` operator, with two bool tensors is not supported",
    ),
}


@pytest.mark.parametrize("fn,args,message", CAST_ERRORS.values(), ids=CAST_ERRORS.keys())
def test_dtype_errors_like_cpu(fn, args, message):
    error = assert_raises_like_cpu(fn, *args)
    assert message in str(error)


def assert_like_cpu(fn, *cpu_tensors: torch.Tensor, context: object = None, exact: bool = True) -> None:
    """``fn`` on the tpu copies gives CPU's result (its dtype and values, NaN where CPU has
    NaN; not ``exact``: within the dtype's rounding), or raises CPU's exception with CPU's
    message (:func:`assert_raises_like_cpu`)."""
    try:
        expected = fn(*(t.clone() for t in cpu_tensors))
    except RuntimeError as cpu_error:
        error = assert_raises_like_cpu(fn, *cpu_tensors)
        assert str(error) == str(cpu_error), context
        return
    got = fn(*(t.to(TPU) for t in cpu_tensors)).cpu()
    assert got.dtype == expected.dtype, context
    tolerance = {"rtol": 0, "atol": 0} if exact else {}
    torch.testing.assert_close(got, expected, equal_nan=True, msg=f"{context}", **tolerance)


ALPHA_OPS = {
    "add": lambda a, b, alpha: torch.add(a, b, alpha=alpha),
    "sub": lambda a, b, alpha: torch.sub(a, b, alpha=alpha),
    "add_number": lambda a, b, alpha: torch.add(a, 2, alpha=alpha),
    "add_": lambda a, b, alpha: a.add_(b, alpha=alpha),
}


@pytest.mark.parametrize("op", ALPHA_OPS.values(), ids=ALPHA_OPS.keys())
@pytest.mark.parametrize("alpha", [True, 3, 0.5, 2j], ids=["bool", "int", "float", "complex"])
def test_an_alpha_the_result_dtype_cannot_take_is_refused_like_cpu(op, alpha):
    """CPU refuses a bool alpha but for a bool result, a float one for an integer result and a
    complex one for a real result (tpu once computed with the alpha cast instead)."""
    for dtype in (torch.bool, torch.int64, torch.float32, torch.complex64):
        a, b = torch.ones(3, dtype=dtype), torch.ones(3, dtype=dtype)
        assert_like_cpu(lambda x, y: op(x, y, alpha), a, b, context=dtype)


FITTED = {
    "add_alpha": lambda x, v: x.add(x, alpha=v),
    "sub_alpha": lambda x, v: x.sub(x, alpha=v),
    "add_alpha_in_place": lambda x, v: x.clone().add_(x, alpha=v),
    "clamp_max": lambda x, v: x.clamp(max=v),
    "clamp_min": lambda x, v: torch.clamp_min(x, v),
    "addcmul_value": lambda x, v: torch.addcmul(x, x, x, value=v),
    "threshold": lambda x, v: torch.threshold(x, v, 1),
    "threshold_value": lambda x, v: torch.threshold(x, 1, v),
    "lerp_weight": lambda x, v: torch.lerp(x, x + 1, v),
    "hardtanh_max": lambda x, v: aten.hardtanh(x, 0.0, v),  # (F.hardtanh refuses min > max itself)
    "hardtanh_min": lambda x, v: aten.hardtanh(x, v, 1.0),
    "hardtanh_default": lambda x, v: aten.hardtanh(x),  # (min -1: refused for uint8)
    "leaky_relu_slope": lambda x, v: F.leaky_relu(x, v),
    "rrelu_eval_slopes": lambda x, v: F.rrelu(x - 1, v, v),  # (leaky_relu with their mean)
    "rrelu_train_slopes": lambda x, v: F.rrelu(x - 1, v, v, training=True),  # (slopes drawn from [v, v])
    "elu_alpha": lambda x, v: F.elu(x, alpha=v),
    "softplus_beta": lambda x, v: F.softplus(x, beta=v),
    "hardshrink_lambda": lambda x, v: F.hardshrink(x, v),
    "logit_eps": lambda x, v: torch.logit(x, eps=v),
    "pow_exponent": lambda x, v: torch.pow(x, v),
    "full_like": lambda x, v: torch.full_like(x, v),
    "new_full": lambda x, v: x.new_full((2,), v),
    "fill_": lambda x, v: x.clone().fill_(v),
    "index_fill": lambda x, v: x.index_fill(0, torch.tensor([1], device=x.device), v),
    "foreach_clamp_min": lambda x, v: torch._foreach_clamp_min([x, x], v)[1],
    "foreach_clamp_max_list": lambda x, v: torch._foreach_clamp_max([x, x], [2, v])[1],
    "foreach_addcmul_value": lambda x, v: torch._foreach_addcmul([x], [x], [x], v)[0],
}
#: (computed with transcendental functions: CPU's values within the dtype's rounding)
ROUNDED = {"elu_alpha", "softplus_beta", "logit_eps", "pow_exponent"}


@pytest.mark.parametrize("name", FITTED)
@pytest.mark.parametrize("dtype", [torch.uint8, torch.int8, torch.int64, torch.float16, torch.float32])
def test_a_scalar_argument_its_dtype_cannot_hold_is_refused_like_cpu(name, dtype):
    """CPU converts these numbers into the op's dtype (float32 for some half-precision
    kernels) and refuses one that overflows it: tpu raises the same error, first in CPU's order
    (hardtanh's int64 conversion of an integer input's limits comes before its dtype's), also
    once the call's plan is kept (a fitting int, then float, first), and computes CPU's values
    for the numbers that fit."""
    op, x = FITTED[name], torch.tensor([0, 1, 2]).to(dtype)
    for value in (1, 2, 300, -1, -300, 2**40, 2**63 + 5, 1.0, 1e5, 1e39, float("inf"), float("nan")):
        if name == "sub_alpha" and value == 2**63 + 5:
            continue  # (CPU subtracts by adding -alpha, a uint64 negated modulo 2**64: not mirrored)
        try:
            op(x, value)
        except NotImplementedError:  # (an op CPU has no kernel of this dtype for)
            continue
        except RuntimeError:
            pass
        assert_like_cpu(lambda t: op(t, value), x, context=value, exact=name not in ROUNDED)


@pytest.mark.parametrize("dtype", [torch.uint8, torch.int32, torch.int64, torch.float32, torch.float64])
@pytest.mark.parametrize("value", [2**63, 2**63 + 5, 2**64 - 1])
def test_a_number_past_int64_computes_like_cpu(dtype, value):
    """A Python int in uint64's range joins an op as CPU's wrapped number does: cast into the
    op's dtype modulo its size (an OverflowError from JAX once)."""
    x = torch.tensor([0, 1, 2]).to(dtype)
    for op in (lambda t: t * value, lambda t: t + value, lambda t: t - value, lambda t: t == value):
        expected = op(x)
        got = op(x.to(TPU)).cpu()
        assert got.dtype == expected.dtype
        torch.testing.assert_close(got, expected, rtol=0, atol=0)


# ----------------------------------------------------------------------------- indexing
INDEX_ERRORS = {
    "past_end": (lambda x: x[10], (5,)),
    "negative_past_start": (lambda x: x[-6], (5,)),
    "second_dim": (lambda x: x[:, 3], (2, 3)),
    "select": (lambda x: x.select(1, 7), (2, 3)),
    "setitem": (lambda x: x.__setitem__(5, 1.0), (5,)),
    "tensor_index": (lambda x: x[torch.tensor([1, 7], device=x.device)], (5,)),
    "index_select": (lambda x: x.index_select(0, torch.tensor([9], device=x.device)), (5,)),
    "gather": (lambda x: x.gather(0, torch.tensor([9], device=x.device)), (5,)),
    "narrow": (lambda x: x.narrow(0, 3, 4), (5,)),
}


@pytest.mark.parametrize("fn,shape", INDEX_ERRORS.values(), ids=INDEX_ERRORS.keys())
def test_index_errors_like_cpu(fn, shape):
    assert_raises_like_cpu(fn, torch.arange(float(torch.Size(shape).numel())).reshape(shape))


def _on(x: torch.Tensor, values) -> tuple:
    return tuple(v.to(x.device) if isinstance(v, torch.Tensor) else v for v in values)


# advanced indexing refused for its shapes alone (PyTorch's test_indexing.py checks each message)
ADVANCED_INDEX_ERRORS = {
    "no_index": (lambda x: aten.index.Tensor(x, []), (3,)),
    "indices_do_not_broadcast": (
        lambda x: x[_on(x, [torch.tensor([[0, 1]]), slice(None), torch.tensor([0, 1, 2])])],
        (2, 3, 4),
    ),
    "false_mask_and_a_list": (lambda x: x[_on(x, [torch.tensor(False), [0, 1], Ellipsis])], (2, 3, 4)),
    "dim_of_size_0": (lambda x: x[:, [0, 1]], (10, 0)),
    "write_into_dim_of_size_0": (lambda x: x.__setitem__((slice(None), [1]), 1.0), (10, 0)),
    "values_do_not_broadcast": (lambda x: x.__setitem__(x > -1, torch.ones(3, device=x.device)), (4,)),
    "empty_values_of_another_dtype": (
        lambda x: x.__setitem__(x > -1, torch.ones(0, dtype=torch.int64, device=x.device)),
        (4,),
    ),
    "values_of_another_dtype": (
        lambda x: x.__setitem__(x > -1, torch.ones(4, dtype=torch.int64, device=x.device)),
        (4,),
    ),
}


@pytest.mark.parametrize("fn,shape", ADVANCED_INDEX_ERRORS.values(), ids=ADVANCED_INDEX_ERRORS.keys())
def test_advanced_index_errors_are_cpus_messages(fn, shape):
    x = torch.arange(float(torch.Size(shape).numel())).reshape(shape)
    with pytest.raises(Exception) as expected:
        fn(x.clone())
    error = assert_raises_like_cpu(fn, x)
    assert str(error) == str(expected.value)


# ----------------------------------------------------------------------------- integer division
# Each division of a tensor ``x`` by a divisor ``d`` that is zero somewhere (PyTorch CPU raises
# ``RuntimeError("ZeroDivisionError")``; XLA would return an arbitrary integer).
DIVISIONS = {
    "floor_divide": torch.floor_divide,
    "remainder": torch.remainder,
    "fmod": torch.fmod,
    "div_trunc": lambda x, d: torch.div(x, d, rounding_mode="trunc"),
    "div_floor": lambda x, d: torch.div(x, d, rounding_mode="floor"),
    "floordiv_operator": lambda x, d: x // d,
    "mod_operator": lambda x, d: x % d,
    # (on a copy: CPU writes the elements before the zero, tpu nothing)
    "in_place": lambda x, d: x.clone().floor_divide_(d),
    "in_place_fmod": lambda x, d: x.clone().fmod_(d),
    "in_place_div_trunc": lambda x, d: x.clone().div_(d, rounding_mode="trunc"),
    "out": lambda x, d: torch.remainder(x, d, out=torch.empty_like(x)),
}
ZERO_DIVISORS = {  # the divisor, built on the device of x
    "tensor": lambda x: torch.tensor([1, 0, 2], dtype=x.dtype, device=x.device),
    "broadcast_tensor": lambda x: torch.tensor([[3], [0]], dtype=x.dtype, device=x.device)[1],
    "zero_dim_tensor": lambda x: torch.tensor(0, device=x.device),
    "cpu_scalar_tensor": lambda x: torch.tensor(0),
    "python_scalar": lambda x: 0,
}


@pytest.mark.parametrize("dtype", [torch.uint8, torch.int8, torch.int64], ids=str)
@pytest.mark.parametrize("divisor", ZERO_DIVISORS)
@pytest.mark.parametrize("op", DIVISIONS)
def test_integer_division_by_zero_raises_like_cpu(op, divisor, dtype):
    error = assert_raises_like_cpu(
        lambda x: DIVISIONS[op](x, ZERO_DIVISORS[divisor](x)), torch.tensor([7, 4, 9], dtype=dtype)
    )
    assert str(error) == "ZeroDivisionError"


@pytest.mark.parametrize("dtype", [torch.uint8, torch.int8], ids=str)
def test_divisor_is_checked_in_the_dtype_it_divides_in(dtype):
    """256 converts to 0 in an 8-bit division, and CPU raises."""
    for divisor in (256, torch.tensor(256)):
        error = assert_raises_like_cpu(lambda x: x // divisor, torch.tensor([7, 4], dtype=dtype))
        assert str(error) == "ZeroDivisionError"


def test_scalar_divided_by_a_tensor_with_a_zero_raises_like_cpu():
    for fn in (lambda d: 7 // d, lambda d: 7 % d, lambda d: torch.remainder(7, d)):
        assert str(assert_raises_like_cpu(fn, torch.tensor([1, 0, 2]))) == "ZeroDivisionError"


def test_a_weakly_typed_divisor_of_several_elements_is_checked_as_a_tensor():
    """A weakly typed device array is a Python number's copy only when it has no dims (PyTorch's
    test_index_reduce met one of several elements: 'The truth value of an array ... is
    ambiguous')."""
    import jax.numpy as jnp

    from torch_tpu.ops._helpers import check_nonzero

    check_nonzero(jnp.full((3,), 2), jnp.int64)
    with pytest.raises(RuntimeError, match="^ZeroDivisionError$"):
        check_nonzero(jnp.full((3,), 0), jnp.int64)
    with pytest.raises(RuntimeError, match="^ZeroDivisionError$"):
        check_nonzero(jnp.full((), 0), jnp.int64)


DIVISION_VALUES = {  # results CPU defines, which the checks must leave alone
    "signs": (torch.tensor([-7, 7, -7, 7]), torch.tensor([2, -2, -2, 2])),
    "int8_min_by_minus_one": (
        torch.tensor([-128, 5], dtype=torch.int8),
        torch.tensor([-1, 3], dtype=torch.int8),
    ),
    "float_by_zero": (torch.tensor([5.0, -5.0, 0.0]), torch.tensor([0.0, 0.0, 0.0])),
    "int_by_float_zero": (torch.tensor([5, -5, 0]), torch.tensor(0.0)),
    "empty_by_zero": (torch.tensor([], dtype=torch.int64), torch.tensor(0)),
}


@pytest.mark.parametrize("case", DIVISION_VALUES)
@pytest.mark.parametrize("op", ["floor_divide", "remainder", "fmod", "div_floor"])
def test_integer_division_values_match_cpu(op, case):
    x, d = DIVISION_VALUES[case]
    expected = DIVISIONS[op](x, d)
    got = DIVISIONS[op](x.to(TPU), d.to(TPU) if d.dim() else d).cpu()
    assert got.dtype == expected.dtype
    torch.testing.assert_close(got, expected, equal_nan=True, rtol=0, atol=0)


def test_bool_division_is_not_implemented_like_cpu():
    for op in ("floor_divide", "remainder", "fmod", "div_trunc"):
        error = assert_raises_like_cpu(DIVISIONS[op], torch.tensor([True, False]), torch.tensor([True, True]))
        assert "not implemented for 'Bool'" in str(error)


def test_division_by_zero_in_fused_eager():
    """A Python scalar divisor raises at the op; a tensor's zero, known only when its graph has
    run, is reported at the next sync point, naming the op (as an index out of range is)."""
    with torch_tpu.eager_mode("fused"):
        x = torch.tensor([7, 4, 9], device=TPU)
        with pytest.raises(RuntimeError, match="^ZeroDivisionError$"):
            x // 0
        quotient = x // (x - 4)
        with pytest.raises(
            RuntimeError,
            match=r"^ZeroDivisionError \(raised by "
            r"aten\.floor_divide\.default at .*test_errors",
        ):
            quotient.cpu()
        assert (x // 2).cpu().tolist() == [3, 2, 4]


# ----------------------------------------------------------------------------- unsupported ops
# Ops with CPU kernels and (today) no tpu lowering, each as an expression of a 1-d tensor ``x``;
# the tests use the first one still unlowered.
_RARE_OPS = [
    ("aten::histogram", "torch.histogram(x, bins=4).hist"),
    (
        "aten::segment_reduce",
        "torch.segment_reduce(x, 'sum', lengths=torch.tensor([len(x) - 1, 1], device=x.device))",
    ),
    (
        "aten::_spdiags",
        "torch.sparse.spdiags(x.reshape(1, -1), torch.tensor([0]), (len(x), len(x))).to_dense().diagonal()",
    ),
]


def _unlowered_op():
    lowered = {name.split(".")[1] for name in torch_tpu.lowered_ops()}
    for name, expression in _RARE_OPS:
        if name.removeprefix("aten::") not in lowered:
            return name, expression
    pytest.fail("every candidate op is lowered now: add an unlowered one to _RARE_OPS")


def test_unlowered_op_names_itself_and_the_fallback_switch():
    name, expression = _unlowered_op()
    x = torch.linspace(0.5, 2.0, 4, device=TPU)
    with pytest.raises(NotImplementedError) as error:
        eval(expression)
    # PyTorch may reach the backend through another overload of the op (often ``.out``)
    assert re.search(rf"'{name}(\.\w+)?' has no tpu lowering", str(error.value))
    assert "TORCH_TPU_CPU_FALLBACK=1" in str(error.value)
    assert x.cpu().tolist() == [0.5, 1.0, 1.5, 2.0]
    assert (x + 1).cpu().tolist() == [1.5, 2.0, 2.5, 3.0]


def test_cpu_fallback_is_opt_in_and_counted(run_python):
    name, expression = _unlowered_op()
    out = run_python(
        f"""
        import json, torch, torch_tpu
        run = lambda x: {expression}
        cpu = torch.linspace(0.5, 2.0, 7)
        result = run(cpu.to("tpu"))
        run(cpu.to("tpu")[::2])
        print(json.dumps({{"device": str(result.device), "equal": torch.equal(result.cpu(), run(cpu)),
                          "counts": dict(torch_tpu.cpu_fallback_counts())}}))
    """,
        TORCH_TPU_CPU_FALLBACK="1",
    )
    report = json.loads(out.splitlines()[-1])
    assert report["device"] == "tpu:0" and report["equal"]
    counts = report["counts"]
    assert {op.split(".")[0] for op in counts} == {name}
    assert sum(counts.values()) == 2


def test_fallback_counts_are_empty_without_fallback():
    assert not torch_tpu.cpu_fallback_counts()


# ----------------------------------------------------------------------------- debug eager
def test_launch_blocking_runs_ops(run_python):
    out = run_python(
        """
        import json, torch, torch_tpu
        from torch_tpu import config

        def work(x):
            y = (x.t() @ x).sum(0)
            x.add_(1)
            torch.mul(x, 2, out=x)
            try:
                x[:, :2] + x
            except RuntimeError:
                pass
            return torch.cat([y, x.flatten()])

        cpu = torch.arange(6.0).view(2, 3)
        tpu = work(cpu.to("tpu"))
        print(json.dumps([config.launch_blocking, torch.equal(tpu.cpu(), work(cpu))]))
    """,
        TPU_LAUNCH_BLOCKING="1",
    )
    assert json.loads(out.splitlines()[-1]) == [True, True]


# ----------------------------------------------------------------------------- generators
GENERATOR_USES = {
    "randn": lambda g: torch.randn(3, device=TPU, generator=g),
    "rand": lambda g: torch.rand(3, device=TPU, generator=g),
    "randint": lambda g: torch.randint(0, 5, (3,), device=TPU, generator=g),
    "randperm": lambda g: torch.randperm(5, device=TPU, generator=g),
    "uniform_": lambda g: torch.zeros(3, device=TPU).uniform_(generator=g),
    "normal_": lambda g: torch.zeros(3, device=TPU).normal_(generator=g),
    "exponential_": lambda g: torch.zeros(3, device=TPU).exponential_(generator=g),
}


@pytest.mark.parametrize("name", GENERATOR_USES)
def test_cpu_generator_on_tpu_is_an_error_like_cuda(name):
    with pytest.raises(RuntimeError, match="Expected a 'tpu' device type for generator but found 'cpu'"):
        GENERATOR_USES[name](torch.Generator())


def test_a_uint8_mask_index_warns_at_the_users_line_as_on_cpu():
    import warnings

    for device in ("cpu", "tpu"):
        x = torch.arange(3.0, device=device)
        mask = torch.tensor([1, 0, 1], dtype=torch.uint8, device=device)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            picked = x[mask]
            x[mask] = torch.tensor([5.0, 6.0], device=device)
        assert picked.tolist() == [0.0, 2.0] and x.tolist() == [5.0, 1.0, 6.0]
        assert [(w.category, w.filename) for w in caught] == [(UserWarning, __file__)] * 2, device
        assert "indexing with dtype torch.uint8 is now deprecated" in str(caught[0].message)


@pytest.mark.parametrize("dtype", [torch.bool, torch.int64, torch.float32])
def test_index_fill_refuses_a_complex_value_for_a_real_tensor_like_cpu(dtype):
    x = torch.tensor([0, 1, 2]).to(dtype)
    for fill in (
        lambda t: t.index_fill(0, torch.tensor([1], device=t.device), 1 + 1j),
        lambda t: t.clone().index_fill_(0, torch.tensor([1], device=t.device), 2j),
    ):
        assert_like_cpu(fill, x)


def test_nonzero_refuses_an_out_of_another_dtype_like_cpu():
    x = torch.tensor([[0, 1], [2, 0]])
    assert_like_cpu(lambda t: torch.nonzero(t, out=torch.empty([0], dtype=torch.float, device=t.device)), x)
    assert_like_cpu(lambda t: torch.nonzero(t, out=torch.empty([0], dtype=torch.long, device=t.device)), x)


@pytest.mark.parametrize("size, step", [(3, 0), (3, -1), (-1, 1), (-2, 0)])
def test_unfold_backward_checks_its_window_like_cpu(size, step):
    raised = []
    for grad in (torch.randn(2, 3), torch.randn(2, 3, device="tpu")):
        with pytest.raises((ValueError, RuntimeError)) as error:
            torch.ops.aten.unfold_backward(grad, [6], 0, size, step)
        raised.append((error.type, str(error.value)))
    assert raised[0] == raised[1]


def test_index_put_with_no_index_raises():
    """PyTorch's ``test_index_put_accumulate_empty``: CPU's shape error where the values do not
    fit, a RuntimeError where they do (CPU's kernels fail an internal assert)."""
    for device in ("cpu", "tpu"):
        with pytest.raises(RuntimeError, match=r"shape mismatch: value tensor of shape \[1\] cannot be"):
            torch.rand([], device=device).index_put([], torch.tensor([1.0], device=device), True)
    with pytest.raises(RuntimeError, match="at least one index"):
        torch.rand(3, device="tpu").index_put([], torch.tensor([1.0], device="tpu"), True)
