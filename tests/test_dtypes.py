"""complex128 and the barebones unsigned dtypes (uint16/32/64) against CPU: storage and views,
promotion, default-dtype factories, Python complex scalars, and exactly CPU's op support for
the unsigned types (the same NotImplementedError where CPU's kernel has none). complex32
stays refused with a clear error."""

from __future__ import annotations

import warnings

import pytest
import torch

import torch_tpu
from torch_tpu.runtime.dtypes import UnsupportedDtypeError

TPU = torch.device("tpu")
UNSIGNED = [torch.uint16, torch.uint32, torch.uint64]


@pytest.fixture(autouse=True, params=["strict", "fused"])
def eager_mode(request):
    with torch_tpu.eager_mode(request.param):
        yield


def _same(tpu, cpu) -> None:
    assert tpu.device.type == "tpu" and tpu.dtype == cpu.dtype and tpu.shape == cpu.shape
    torch.testing.assert_close(tpu.cpu(), cpu, rtol=0, atol=0, equal_nan=True)


def _same_outcome(fn) -> None:
    """``fn`` on CPU and on tpu: the same values, or the same exception type."""
    try:
        expected = fn("cpu")
    except Exception as error:  # noqa: BLE001
        with pytest.raises(type(error)):
            fn(TPU)
        return
    _same(fn(TPU), expected)


# ----------------------------------------------------------------------------- complex128
COMPLEX128 = torch.tensor(
    [1 + 2j, -3.5 + 0.25j, 1e300 - 1e-300j, complex(float("inf"), -0.0)], dtype=torch.complex128
)


def test_complex128_round_trip_and_views():
    tpu = COMPLEX128.to(TPU)
    _same(tpu, COMPLEX128)
    _same(tpu.real.clone(), COMPLEX128.real)
    _same(tpu.imag.clone(), COMPLEX128.imag)
    _same(torch.view_as_real(tpu).clone(), torch.view_as_real(COMPLEX128))
    _same(torch.view_as_complex(torch.view_as_real(tpu)).clone(), COMPLEX128)
    _same(tpu.view(torch.float64).clone(), COMPLEX128.view(torch.float64))
    _same(tpu.conj().clone(), COMPLEX128.conj())
    _same(tpu[:2].conj() * tpu[:2], COMPLEX128[:2].conj() * COMPLEX128[:2])
    tpu.imag.fill_(7.0)  # a write through a view
    _same(tpu, torch.complex(COMPLEX128.real, torch.full((4,), 7.0, dtype=torch.float64)))


def test_complex128_ops_keep_double_precision():
    z = torch.tensor([1 + 1e-12j, 2 - 3j, -0.5 + 0.5j], dtype=torch.complex128)
    for fn in (torch.exp, torch.sum, torch.fft.fft, lambda x: x @ x, lambda x: x / 3):
        actual, expected = fn(z.to(TPU)), fn(z)
        assert actual.dtype == torch.complex128
        torch.testing.assert_close(actual.cpu(), expected, rtol=1e-13, atol=0)


def test_complex64_with_float64_promotes_to_complex128():
    a = torch.tensor([1 + 2j, 3 - 1j], dtype=torch.complex64)
    b = torch.tensor([0.1, 1e-9], dtype=torch.float64)
    _same(a.to(TPU) + b.to(TPU), a + b)
    _same(torch.block_diag(a.to(TPU), b.to(TPU)), torch.block_diag(a, b))


def test_default_float64_makes_complex_factories_complex128():
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        _same(torch.full((2,), 1j, device=TPU), torch.full((2,), 1j))
        _same(torch.tensor([1j, 2], device=TPU), torch.tensor([1j, 2]))
        assert torch.randn(2, dtype=torch.complex128, device=TPU).dtype == torch.complex128
    finally:
        torch.set_default_dtype(old)


@pytest.mark.parametrize(
    "dtype", [torch.float32, torch.float64, torch.int64, torch.complex64, torch.complex128], ids=str
)
def test_python_complex_scalar_times_tensor(dtype):
    x = torch.arange(4).to(dtype)
    _same(x.to(TPU) * 2j, x * 2j)
    _same(2j * x.to(TPU), 2j * x)
    _same(x.to(TPU) + (1 - 0.5j), x + (1 - 0.5j))


def test_complex32_stays_refused():
    with pytest.raises(UnsupportedDtypeError, match="tpu does not support dtype torch.complex32"):
        torch.zeros(2, dtype=torch.chalf, device=TPU)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # CPU's "ComplexHalf support is experimental"
        half = torch.zeros(2, dtype=torch.chalf)
    with pytest.raises(UnsupportedDtypeError):
        half.to(TPU)


# ----------------------------------------------------------------------------- uint16/32/64
def _unsigned(dtype, device="cpu"):
    big = torch.iinfo(dtype).max if dtype != torch.uint64 else 2**64 - 1
    return torch.tensor([0, 1, 7, 200, 65535, big], dtype=dtype, device=device)


@pytest.mark.parametrize("dtype", UNSIGNED, ids=str)
def test_unsigned_creation_and_copies(dtype):
    cpu = _unsigned(dtype)
    _same(cpu.to(TPU), cpu)
    _same(torch.empty(6, dtype=dtype, device=TPU).copy_(cpu), cpu)
    _same(torch.zeros(3, dtype=dtype, device=TPU), torch.zeros(3, dtype=dtype))
    _same(torch.full((3,), 9, dtype=dtype, device=TPU), torch.full((3,), 9, dtype=dtype))
    _same(cpu.to(TPU).to(torch.int64), cpu.to(torch.int64))
    _same(cpu.to(TPU).to(torch.float64), cpu.to(torch.float64))
    # in-range and negative floats: CPU's own result for values outside int64 depends on its loop
    floats = torch.tensor([-1.0, -70000.0, 3.7, 65536.0, 2.0**31, 1e10])
    _same(floats.to(TPU).to(dtype), floats.to(dtype))
    _same(torch.tensor([-1, 70000, 2**40]).to(TPU).to(dtype), torch.tensor([-1, 70000, 2**40]).to(dtype))
    assert cpu.to(TPU)[-1].item() == cpu[-1].item()


@pytest.mark.parametrize("dtype", UNSIGNED, ids=str)
def test_unsigned_views(dtype):
    cpu = _unsigned(dtype)
    tpu = cpu.to(TPU)
    _same(tpu[1:4].clone(), cpu[1:4])
    _same(tpu.view(torch.uint8).clone(), cpu.view(torch.uint8))
    _same(tpu.view(torch.int16).clone(), cpu.view(torch.int16))
    _same(
        torch.arange(24, dtype=torch.uint8).to(TPU).view(dtype).clone(),
        torch.arange(24, dtype=torch.uint8).view(dtype),
    )


UNSIGNED_OPS = {  # what CPU runs on these dtypes, and some of what it refuses
    "eq": lambda x, y: x == y,
    "ne_scalar": lambda x, y: x != 7,
    "and": lambda x, y: x & y,
    "or_scalar": lambda x, y: x | 12,
    "xor": lambda x, y: x ^ y,
    "mul": lambda x, y: x * y,
    "mul_scalar": lambda x, y: x * 3,
    "true_div": lambda x, y: x / 4,
    "sum": lambda x, y: x.sum(),
    "where": lambda x, y: torch.where(x == y, x, y),
    "sort": lambda x, y: x.sort().values,
    "cat": lambda x, y: torch.cat([x, y]),
    "float_promotion": lambda x, y: x + 0.5,
    # CPU: NotImplementedError
    "add": lambda x, y: x + y,
    "sub_scalar": lambda x, y: x - 1,
    "lt": lambda x, y: x < y,
    "not": lambda x, y: ~x,
    "shift": lambda x, y: x << 1,
    "floor_divide": lambda x, y: x // 3,
    "neg": lambda x, y: -x,
    "abs": lambda x, y: x.abs(),
    "max": lambda x, y: x.max(),
    "sum_into_unsigned": lambda x, y: x.sum(dtype=x.dtype),
    "arange": lambda x, y: torch.arange(3, dtype=x.dtype, device=x.device),
    # CPU: RuntimeError (no promotion with other integer types)
    "with_int16": lambda x, y: x + y.to(torch.int16),
    "with_bool": lambda x, y: x & (y > 0),
    # CPU: RuntimeError before its kernel (mean of an integer tensor)
    "mean": lambda x, y: x.mean(),
}


@pytest.mark.parametrize("dtype", UNSIGNED, ids=str)
@pytest.mark.parametrize("op", UNSIGNED_OPS)
def test_unsigned_ops_match_cpu(op, dtype):
    x = torch.tensor([0, 1, 7, 200, 65535], dtype=dtype)
    y = torch.tensor([3, 1, 8, 100, 5], dtype=dtype)
    _same_outcome(lambda device: UNSIGNED_OPS[op](x.to(device), y.to(device)))


def test_unsigned_refusal_names_the_dtype():
    with pytest.raises(NotImplementedError, match="not implemented for 'UInt32'"):
        torch.ones(2, dtype=torch.uint32, device=TPU) + 1
    with pytest.raises(RuntimeError, match="Promotion for uint16, uint32, uint64 types is not supported"):
        torch.ones(2, dtype=torch.uint16, device=TPU) + torch.ones(2, dtype=torch.int64, device=TPU)


def test_unsigned_op_lists_name_lowerings():
    """Every overload the unsigned lists name is a tpu lowering (no stale entries)."""
    from torch_tpu.ops import cpu_dtypes as unsigned
    from torch_tpu.ops.registry import LOWERINGS

    lowered = {str(op).removeprefix("aten.") for op in LOWERINGS}
    assert not (unsigned.OPS | unsigned.FACTORIES) - lowered
