"""Float values converted to integer tensors, against CPU: casts (``.to``), copies into integer
tensors and fills give x86 CPU's results, where XLA would saturate (NaN, infinities and
out-of-range values become the most negative int64/int32, and narrower types keep its low bits);
fills with a Python number raise PyTorch's overflow error where CPU does."""

from __future__ import annotations

import warnings

import pytest
import torch

import torch_tpu

TPU = torch.device("tpu")
FLOATS = [torch.float64, torch.float32, torch.float16, torch.bfloat16]
TARGETS = [torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool]
VALUES = [
    float("nan"),
    float("inf"),
    float("-inf"),
    0.0,
    -0.0,
    0.5,
    -0.5,
    2.7,
    -2.7,
    127.5,
    -128.5,
    255.9,
    300.0,
    -1.0,
    -129.0,
    32767.9,
    -32768.9,
    65535.0,
    70000.0,
    -70000.5,
    2.0**31 - 1,
    2.0**31,
    -(2.0**31),
    -(2.0**31) - 1,
    2.0**32 + 5,
    1e10,
    -(2.0**40 + 7),
    2.0**62 + 2.0**20,
    2.0**63 - 1024,
    2.0**63,
    -(2.0**63),
    1e20,
    -1e20,
]


@pytest.fixture(autouse=True, params=["strict", "fused"])
def eager_mode(request):
    with torch_tpu.eager_mode(request.param):
        yield


def _values(dtype: torch.dtype) -> torch.Tensor:
    return torch.tensor(VALUES, dtype=torch.float64).to(dtype)


def assert_same(tpu: torch.Tensor, cpu: torch.Tensor) -> None:
    assert tpu.device.type == "tpu" and tpu.dtype == cpu.dtype
    assert tpu.cpu().tolist() == cpu.tolist()


def _zeros(x: torch.Tensor, target: torch.dtype, size: int = 1) -> torch.Tensor:
    return torch.zeros(size * x.numel(), dtype=target, device=x.device)


def _setitem(x: torch.Tensor, target: torch.dtype) -> torch.Tensor:
    out = _zeros(x, target)
    out[:] = x
    return out


CONVERSIONS = {  # each turns the float tensor x (on its device) into `target` values
    "to": lambda x, target: x.to(target),
    "to_strided": lambda x, target: x[::2].to(target),
    "copy_": lambda x, target: _zeros(x, target).copy_(x),
    "copy_into_view": lambda x, target: _zeros(x, target, 2)[::2].copy_(x),
    "copy_from_host": lambda x, target: _zeros(x, target).copy_(x.cpu()),
    "foreach_copy_": lambda x, target: torch._foreach_copy_([_zeros(x, target)], [x])[0],
    "setitem": _setitem,
}


@pytest.mark.parametrize("target", TARGETS, ids=str)
@pytest.mark.parametrize("source", FLOATS, ids=str)
@pytest.mark.parametrize("how", CONVERSIONS)
def test_float_to_integer_matches_cpu(how, source, target):
    cpu = _values(source)
    assert_same(CONVERSIONS[how](cpu.to(TPU), target), CONVERSIONS[how](cpu, target))


@pytest.mark.parametrize("target", TARGETS, ids=str)
def test_fill_with_a_float_tensor_matches_cpu(target):
    for value in VALUES:
        expected = torch.zeros(2, dtype=target).fill_(torch.tensor(value))
        assert_same(torch.zeros(2, dtype=target, device=TPU).fill_(torch.tensor(value, device=TPU)), expected)


def test_complex_to_integer_keeps_the_real_part_like_cpu():
    cpu = torch.complex(_values(torch.float32), torch.ones(len(VALUES)))
    with warnings.catch_warnings():  # (CPU warns once per process)
        warnings.simplefilter("ignore")
        expected = cpu.to(torch.int64)
    with pytest.warns(UserWarning, match="discards the imaginary part") as record:
        got = cpu.to(TPU).to(torch.int64)
    assert_same(got, expected)
    assert {w.filename for w in record} == {__file__}  # the user's line, as CPU's warning
    with pytest.warns(UserWarning, match="discards the imaginary part") as record:
        torch.zeros(len(VALUES), device=TPU).copy_(cpu)
    assert {w.filename for w in record} == {__file__}


SCALAR_FILLS = {
    "fill_": lambda value, dtype, device: torch.zeros(2, dtype=dtype, device=device).fill_(value),
    "full": lambda value, dtype, device: torch.full((2,), value, dtype=dtype, device=device),
    # (CPU fills one half-precision element unchecked, rounding to inf)
    "fill_one": lambda value, dtype, device: torch.zeros(1, dtype=dtype, device=device).fill_(value),
    "full_0_dim": lambda value, dtype, device: torch.full((), value, dtype=dtype, device=device),
}
SCALARS = [
    float("nan"),
    float("inf"),
    -1.0,
    -0.5,
    0.7,
    255.9,
    300.0,
    65519.0,
    2.0**31,
    2.0**63,
    1e20,
    1e39,
    -1,
    -255,
    -256,
    256,
    70000,
    2**40,
    True,
]


@pytest.mark.parametrize("dtype", TARGETS + FLOATS, ids=str)
@pytest.mark.parametrize("fill", SCALAR_FILLS)
def test_fill_with_a_python_number_matches_cpu(fill, dtype):
    """CPU converts the number with an overflow check (c10's ``checked_convert``): an integer
    type takes no NaN and nothing past its range (though -1 wraps into uint8), float32 nothing
    finite past its range; what passes converts as a cast does (2.0**63 -> int64 min)."""
    for value in SCALARS:
        try:
            expected = SCALAR_FILLS[fill](value, dtype, "cpu")
        except RuntimeError as error:
            with pytest.raises(RuntimeError, match=f"^{error}$"):
                SCALAR_FILLS[fill](value, dtype, TPU)
        else:
            got = SCALAR_FILLS[fill](value, dtype, TPU)
            assert got.dtype == expected.dtype
            assert str(got.cpu().tolist()) == str(expected.tolist()), value  # (NaN included)


@pytest.mark.parametrize(
    ("shape", "strides"),
    [((1, 0), (0, 0)), ((2, 0, 3), (0, 0, 0)), ((0, 3), (1, 0)), ((3, 0), (1, 3))],
)
def test_empty_tensors_of_any_strides_copy_as_on_cpu(shape, strides):
    """An empty tensor's strides are free (``make_tensor_with_pad([[]])`` gives ``(0, 0)``);
    copies and casts keep them as CPU's do."""
    for dtype in (torch.int64, torch.float32):
        host = torch.empty_strided(shape, strides, dtype=dtype)
        for convert in (lambda t: t, torch.clone, lambda t: t.float(), torch.empty_like):
            on_tpu = convert(host.to("tpu"))
            assert (on_tpu.shape, on_tpu.stride()) == (convert(host).shape, convert(host).stride())
