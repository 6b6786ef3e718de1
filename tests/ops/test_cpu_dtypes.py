"""Dtypes against CPU: tpu refuses exactly what CPU's kernels refuse, with CPU's exception type
(the generated table of ``ops.cpu_dtypes`` and the lowerings' own dtype checks), and picks result
dtypes as CPU does, the default dtype included (``torch.set_default_dtype``)."""

from __future__ import annotations

import warnings

import pytest
import torch

import torch_tpu  # noqa: F401  (registers the device)
from torch_tpu.ops import cpu_dtypes
from torch_tpu.ops.registry import LOWERINGS

TPU = torch.device("tpu")
F = torch.nn.functional
_OVERLOADS = {str(op).removeprefix("aten."): op for op in LOWERINGS}


def _outcome(fn, device):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            out = fn(device)
        except Exception as error:  # noqa: BLE001
            return error
    return [x.to("cpu") for x in (out if isinstance(out, (tuple, list)) else (out,))]


def _same_outcome(fn) -> None:
    """``fn`` on CPU and on tpu: the same exception type, or results of the same dtypes and values."""
    expected, actual = _outcome(fn, "cpu"), _outcome(fn, TPU)
    if isinstance(expected, Exception):
        assert type(actual) is type(expected), f"CPU raised {expected!r}, tpu gave {actual!r}"
        return
    assert not isinstance(actual, Exception), f"CPU ran, tpu raised {actual!r}"
    assert [x.dtype for x in actual] == [x.dtype for x in expected]
    for a, e in zip(actual, expected):
        torch.testing.assert_close(a, e, equal_nan=True)


# ----------------------------------------------------------------------------- the table
def test_table_names_lowerings_and_their_arguments():
    """Every overload the tables list is a tpu lowering, keyed by one of its arguments (``*``:
    an elementwise lowering's common dtype) and conditioned on others, with dtypes torch has: a
    stale entry fails here."""
    beyond = {key: {arg: dtypes} for key, (arg, dtypes, _) in cpu_dtypes.BEYOND_PROBE.items()}
    for key, by_arg in [*cpu_dtypes.REFUSED.items(), *beyond.items()]:
        assert key in _OVERLOADS, f"{key} is no tpu lowering"
        entry = LOWERINGS[_OVERLOADS[key]]
        names = [a.name for a in entry.op._schema.arguments]
        for spelled, dtypes in by_arg.items():
            arg, _, condition = spelled.removesuffix("]").partition("[")
            assert arg in names or (arg == "*" and entry.promote is not None), (key, arg)
            assert all(f.partition("=")[0] in names for f in condition.split(",") if f), (key, spelled)
            assert all(isinstance(getattr(torch, d), torch.dtype) for d in dtypes.split())


def _tensor_only_calls():
    """(overload, dtype) for every table entry whose required arguments are all tensors: the
    call that CPU's kernel refuses, made with (2, 2) tensors of that dtype."""
    for key, by_arg in sorted(cpu_dtypes.REFUSED.items()):
        required = [
            a for a in _OVERLOADS[key]._schema.arguments if not a.has_default_value() and not a.kwarg_only
        ]
        if not required or any(str(a.type) != "Tensor" for a in required):
            continue
        cuda_runs = cpu_dtypes.CUDA_RUNS.get(key, ("", ""))[0].split()
        for dtype in sorted({d for dtypes in by_arg.values() for d in dtypes.split()} - set(cuda_runs)):
            yield pytest.param(key, dtype, id=f"{key}-{dtype}")


@pytest.mark.parametrize("key, dtype", list(_tensor_only_calls()))
def test_table_refusals_match_cpu(key, dtype):
    op = _OVERLOADS[key]
    required = [a for a in op._schema.arguments if not a.has_default_value()]
    base = torch.tensor([[1, 0], [3, 1]]).to(getattr(torch, dtype))

    def call(device):
        return op(*[base.to(device) for _ in required])

    cpu = _outcome(call, "cpu")
    if not isinstance(cpu, NotImplementedError):
        pytest.skip(f"CPU: {cpu!r} for (2, 2) tensors (the table's sample needed other arguments)")
    with pytest.raises(
        NotImplementedError, match=f'"{op._schema.name.removeprefix("aten::")}" not implemented'
    ):
        call(TPU)


FAMILIES = {  # CPU's kernel has no implementation for the dtype: NotImplementedError
    "abs_bool": lambda d: torch.abs(torch.ones(3, dtype=torch.bool, device=d)),
    "ceil_bool": lambda d: torch.ceil(torch.ones(3, dtype=torch.bool, device=d)),
    "frac_int": lambda d: torch.frac(torch.arange(3, device=d)),
    "round_bool": lambda d: torch.round(torch.ones(3, dtype=torch.bool, device=d)),
    "round_decimals_int": lambda d: torch.round(torch.arange(3, device=d), decimals=2),
    "logaddexp_int": lambda d: torch.logaddexp(torch.arange(3, device=d), torch.arange(3, device=d)),
    "gcd_bool": lambda d: torch.gcd(
        torch.ones(3, dtype=torch.bool, device=d), torch.ones(3, dtype=torch.bool, device=d)
    ),
    "bitwise_and_float": lambda d: torch.ones(3, device=d) & torch.ones(3, device=d),
    "bitwise_not_float": lambda d: torch.bitwise_not(torch.ones(3, device=d)),
    "shift_bool": lambda d: (
        torch.ones(3, dtype=torch.bool, device=d) << torch.ones(3, dtype=torch.bool, device=d)
    ),
    "kthvalue_bool": lambda d: torch.kthvalue(torch.ones(3, dtype=torch.bool, device=d), 1),
    "median_bool": lambda d: torch.median(torch.ones(3, dtype=torch.bool, device=d)),
    "softmax_bool": lambda d: torch.softmax(torch.ones(3, dtype=torch.bool, device=d), 0),
    "log_softmax_int": lambda d: torch.log_softmax(torch.arange(3, device=d), 0),
    "avg_pool2d_bool": lambda d: F.avg_pool2d(torch.ones(1, 4, 4, dtype=torch.bool, device=d), 2),
    "max_pool2d_bool": lambda d: F.max_pool2d(torch.ones(1, 4, 4, dtype=torch.bool, device=d), 2),
    "glu_int": lambda d: F.glu(torch.arange(4, device=d)),
    # refused input with an int64 target of the same dtype: the refusal, not a meta replay's error
    "nll_loss_int": lambda d: F.nll_loss(
        torch.ones(3, 4, dtype=torch.int64, device=d), torch.tensor([0, 1, 2], device=d)
    ),
    "scatter_reduce_sum_bool_runs": lambda d: torch.zeros(3, dtype=torch.bool, device=d).scatter_reduce(
        0, torch.tensor([0, 1], device=d), torch.ones(2, dtype=torch.bool, device=d), "sum"
    ),
    "mse_loss_int": lambda d: F.mse_loss(torch.arange(3, device=d), torch.arange(3, device=d)),
    "layer_norm_int": lambda d: F.layer_norm(torch.arange(6, device=d).view(2, 3), (3,)),
    "interpolate_linear_uint8": lambda d: F.interpolate(
        torch.ones(1, 1, 4, dtype=torch.uint8, device=d), scale_factor=2, mode="linear"
    ),
    "linalg_lu_int": lambda d: torch.linalg.lu(torch.eye(2, dtype=torch.int64, device=d)),
    "cross_bool": lambda d: torch.linalg.cross(
        torch.ones(3, dtype=torch.bool, device=d), torch.ones(3, dtype=torch.bool, device=d)
    ),
    # a foreach op refuses what its single op refuses (the probe's foreach OpInfos and list calls)
    "foreach_lerp_scalar_int": lambda d: torch._foreach_lerp_(
        [torch.arange(3, device=d)], [torch.arange(3, device=d)], 0.5
    ),
    "foreach_frac_int": lambda d: torch._foreach_frac([torch.arange(3, device=d)]),
    "foreach_clamp_min_complex": lambda d: torch._foreach_clamp_min(
        [torch.ones(2, dtype=torch.cfloat, device=d)], 1.0
    ),
    "bmm_bool": lambda d: torch.bmm(
        torch.ones(1, 2, 2, dtype=torch.bool, device=d), torch.ones(1, 2, 2, dtype=torch.bool, device=d)
    ),
    "atan2_complex": lambda d: torch.atan2(
        torch.ones(2, dtype=torch.cfloat, device=d), torch.ones(2, dtype=torch.cfloat, device=d)
    ),
    "bincount_float": lambda d: torch.bincount(torch.ones(3, device=d)),
    # refusals of runtime kernels (batch norm's in-place statistics, rrelu's noise)
    "batch_norm_train_int": lambda d: F.batch_norm(
        torch.ones(2, 3, 4, dtype=torch.int32, device=d), None, None, training=True
    ),
    "batch_norm_eval_bool": lambda d: F.batch_norm(
        torch.ones(2, 3, 4, dtype=torch.bool, device=d),
        torch.zeros(3, device=d),
        torch.ones(3, device=d),
    ),
    "native_batch_norm_uint8": lambda d: torch.native_batch_norm(
        torch.ones(2, 3, dtype=torch.uint8, device=d), None, None, None, None, True, 0.1, 1e-5
    ),
    "native_batch_norm_legit_int": lambda d: torch.ops.aten._native_batch_norm_legit(
        torch.ones(2, 3, dtype=torch.int64, device=d), None, None, True, 0.1, 1e-5
    ),
    "rrelu_train_half": lambda d: F.rrelu(torch.ones(3, dtype=torch.half, device=d), training=True),
    "rrelu_train_bfloat16_runs": lambda d: (
        F.rrelu(torch.ones(3, dtype=torch.bfloat16, device=d), training=True) * 0
    ),
    "adaptive_avg_pool2d_int": lambda d: F.adaptive_avg_pool2d(
        torch.ones(1, 4, 4, dtype=torch.int32, device=d), 2
    ),
    "interpolate_area_uint8": lambda d: F.interpolate(
        torch.ones(1, 1, 4, 4, dtype=torch.uint8, device=d), size=2, mode="area"
    ),
    "ldl_factor_half": lambda d: torch.linalg.ldl_factor(torch.eye(3, dtype=torch.half, device=d)),
    "ldl_factor_bfloat16": lambda d: torch.linalg.ldl_factor_ex(torch.eye(3, dtype=torch.bfloat16, device=d)),
    # refusals hanging on another argument: the reduction, the bounds given, the ``dtype=``
    "scatter_reduce_mean_bool": lambda d: torch.zeros(3, dtype=torch.bool, device=d).scatter_reduce(
        0, torch.tensor([0, 1], device=d), torch.ones(2, dtype=torch.bool, device=d), "mean"
    ),
    "clamp_bool": lambda d: torch.clamp(torch.ones(3, dtype=torch.bool, device=d), False, True),
    "clamp_min_bool": lambda d: torch.ones(3, dtype=torch.bool, device=d).clamp_min(False),
    "clamp_bool_tensors": lambda d: torch.clamp(*[torch.ones(3, dtype=torch.bool, device=d)] * 3),
    "clamp_bool_one_tensor_runs": lambda d: torch.clamp(
        torch.ones(3, dtype=torch.bool, device=d), max=torch.zeros(3, dtype=torch.bool, device=d)
    ),
    "cumsum_bool_dtype_bool": lambda d: torch.ones(3, dtype=torch.bool, device=d).cumsum(0, dtype=torch.bool),
    "cumsum_bool_runs": lambda d: torch.ones(3, dtype=torch.bool, device=d).cumsum(0),
    "masked_cumprod_bool": lambda d: torch.masked._ops.cumprod(
        torch.ones(3, dtype=torch.bool, device=d), 0, mask=torch.ones(3, dtype=torch.bool, device=d)
    ),
    "kthvalue_bool_one_element_runs": lambda d: torch.kthvalue(torch.ones((), dtype=torch.bool, device=d), 1),
    "ceil_complex": lambda d: torch.ceil(torch.ones(2, dtype=torch.cfloat, device=d)),
    "sign_complex": lambda d: torch.sign(torch.ones(2, dtype=torch.cfloat, device=d)),
    "clamp_complex": lambda d: torch.clamp(torch.ones(2, dtype=torch.cfloat, device=d), 0, 1),
    "layer_norm_uint16": lambda d: F.layer_norm(torch.ones(2, 3, dtype=torch.uint16, device=d), (3,)),
    "avg_pool1d_uint32": lambda d: F.avg_pool1d(torch.ones(1, 2, 4, dtype=torch.uint32, device=d), 2),
    # CPU's own argument checks: RuntimeError
    "addcdiv_int": lambda d: torch.addcdiv(*[torch.arange(1, 4, device=d)] * 3),
    "addcdiv_int_float": lambda d: torch.addcdiv(
        torch.arange(3, device=d), torch.ones(3, device=d), torch.arange(1, 4, device=d)
    ),
    "cdist_int": lambda d: torch.cdist(
        torch.ones(2, 3, dtype=torch.int64, device=d), torch.ones(2, 3, dtype=torch.int64, device=d)
    ),
    "matrix_exp_int": lambda d: torch.linalg.matrix_exp(torch.eye(2, dtype=torch.int64, device=d)),
    "svdvals_int": lambda d: torch.linalg.svdvals(torch.eye(2, dtype=torch.int64, device=d)),
    "relu_bool": lambda d: torch.relu(torch.ones(3, dtype=torch.bool, device=d)),
    "relu_int": lambda d: torch.relu(torch.arange(-2, 2, device=d)),
    "hardtanh_bool": lambda d: F.hardtanh(torch.ones(3, dtype=torch.bool, device=d)),
    "topk_bool": lambda d: torch.topk(torch.ones(3, dtype=torch.bool, device=d), 2),
    "argmax_bool": lambda d: torch.argmax(torch.ones(3, dtype=torch.bool, device=d)),
    "argmin_bool_dim": lambda d: torch.argmin(torch.ones(3, dtype=torch.bool, device=d), 0),
    "polar_int": lambda d: torch.polar(
        torch.ones(2, dtype=torch.int32, device=d), torch.ones(2, dtype=torch.int32, device=d)
    ),
    "complex_int": lambda d: torch.complex(
        torch.ones(2, dtype=torch.int64, device=d), torch.ones(2, dtype=torch.int64, device=d)
    ),
    "isin_bool": lambda d: torch.isin(
        torch.ones(2, dtype=torch.bool, device=d), torch.ones(2, dtype=torch.bool, device=d)
    ),
    "sub_bool_float": lambda d: torch.ones(2, dtype=torch.bool, device=d) - torch.ones(2, device=d),
    "sub_bool_bool": lambda d: (
        torch.ones(2, dtype=torch.bool, device=d) - torch.ones(2, dtype=torch.bool, device=d)
    ),
    "rsub_bool_scalar": lambda d: 1 - torch.ones(2, dtype=torch.bool, device=d),
    "tanhshrink_bool": lambda d: F.tanhshrink(torch.ones(2, dtype=torch.bool, device=d)),
    "embedding_bag_int": lambda d: F.embedding_bag(
        torch.tensor([0, 1], device=d),
        torch.ones(3, 2, dtype=torch.int64, device=d),
        torch.tensor([0], device=d),
    ),
    "soft_margin_loss_int": lambda d: F.soft_margin_loss(
        torch.ones(2, dtype=torch.int64, device=d), torch.ones(2, dtype=torch.int64, device=d)
    ),
    # CPU refuses bool with both bounds, empty or not, and runs it with one
    "clamp_bool_empty_bounds": lambda d: torch.clamp(
        torch.ones(0, dtype=torch.bool, device=d),
        min=torch.ones(0, dtype=torch.bool, device=d),
        max=torch.ones(0, dtype=torch.bool, device=d),
    ),
    "clamp_bool_empty_min_runs": lambda d: torch.clamp(
        torch.ones(0, dtype=torch.bool, device=d), min=torch.ones(0, dtype=torch.bool, device=d)
    ),
}


def _conv(n, dtype, transposed=False, dilation=1, batch=1):
    def call(d):
        conv = getattr(F, f"conv_transpose{n}d" if transposed else f"conv{n}d")
        x, w = (
            torch.ones((batch, 2) + (6,) * n, dtype=dtype, device=d),
            torch.ones((2, 2) + (2,) * n, dtype=dtype, device=d),
        )
        return conv(x, w, dilation=dilation)

    return call


for _n in (1, 2, 3):  # CPU's slow transposed and dilated kernels lack the small integer dtypes
    FAMILIES |= {
        f"conv{_n}d_int8_runs": _conv(_n, torch.int8),
        f"conv{_n}d_dilated_int16": _conv(_n, torch.int16, dilation=2),
        f"conv_transpose{_n}d_uint8": _conv(_n, torch.uint8, transposed=True),
        f"conv_transpose{_n}d_int32": _conv(_n, torch.int32, transposed=True),
        f"conv_transpose{_n}d_int64_runs": _conv(_n, torch.int64, transposed=True),
        f"conv_transpose{_n}d_int8_empty_runs": _conv(_n, torch.int8, transposed=True, batch=0),
    }


@pytest.mark.parametrize("case", FAMILIES)
def test_dtype_refusals_match_cpu(case):
    expected = _outcome(FAMILIES[case], "cpu")
    if not case.endswith("_runs") and case not in ("relu_int", "addcdiv_int_float"):
        assert isinstance(expected, (NotImplementedError, RuntimeError)), expected  # the case tests a refusal
    _same_outcome(FAMILIES[case])


def test_refusal_names_op_and_dtype():
    with pytest.raises(NotImplementedError, match="\"abs\" not implemented for 'Bool'"):
        torch.abs(torch.ones(2, dtype=torch.bool, device=TPU))
    with pytest.raises(NotImplementedError, match="\"logaddexp\" not implemented for 'Long'"):
        torch.logaddexp(torch.arange(2, device=TPU), torch.arange(2, device=TPU))
    # a float operand makes CPU's common dtype float: it runs
    _same_outcome(lambda d: torch.logaddexp(torch.arange(2, device=d), torch.ones(2, device=d)))


# ----------------------------------------------------------------------------- default dtype
DEFAULT_DTYPE = {  # integer inputs to float-producing ops, and factories of Python floats
    "true_divide": lambda d: torch.arange(4, device=d) / 3,
    "div_none": lambda d: torch.div(torch.arange(4, device=d), 3, rounding_mode=None),
    "int_plus_float": lambda d: torch.arange(4, device=d) + 0.5,
    "sigmoid": lambda d: torch.sigmoid(torch.arange(4, device=d)),
    "sqrt": lambda d: torch.sqrt(torch.arange(4, dtype=torch.int8, device=d)),
    "atan2": lambda d: torch.atan2(torch.arange(4, device=d), torch.ones(4, dtype=torch.bool, device=d)),
    "ldexp": lambda d: torch.ldexp(torch.arange(4, device=d), torch.arange(4, device=d)),
    "ldexp_float": lambda d: torch.ldexp(torch.ones(4, device=d), torch.arange(4, device=d)),
    "logsumexp": lambda d: torch.logsumexp(torch.arange(4, device=d), 0),
    "tensor": lambda d: torch.tensor([1.5, 2.0], device=d),
    "arange": lambda d: torch.arange(0, 1, 0.25, device=d),
    "linspace": lambda d: torch.linspace(0, 1, 5, device=d),
    "full": lambda d: torch.full((2,), 1.5, device=d),
    "zeros": lambda d: torch.zeros(2, device=d),
    "rand": lambda d: torch.rand(2, device=d) * 0,  # the dtype; values differ from CPU's draws
    "randn": lambda d: torch.randn(2, device=d) * 0,
}


@pytest.mark.parametrize("default", [torch.float64, torch.float32], ids=str)
@pytest.mark.parametrize("case", DEFAULT_DTYPE)
def test_default_dtype_matches_cpu(case, default):
    """Run after a call under the other default dtype, so a promotion cached under it would show."""
    fn = DEFAULT_DTYPE[case]
    previous = torch.get_default_dtype()
    other = torch.float32 if default == torch.float64 else torch.float64
    try:
        torch.set_default_dtype(other)
        _ = _outcome(fn, TPU)
        torch.set_default_dtype(default)
        _same_outcome(fn)
    finally:
        torch.set_default_dtype(previous)


def test_refusals_cuda_does_not_share_run_as_on_cuda():
    """CPU has no integer histc; CUDA does, and Transformers' MoE routing uses it off CPU."""
    assert set(cpu_dtypes.CUDA_RUNS) <= set(cpu_dtypes.REFUSED)  # (no stale entry)
    experts = torch.tensor([0, 2, 2, 3, 1, 2], dtype=torch.int32)
    expected = torch.histc(experts.float(), bins=4, min=0, max=3).to(torch.int32)
    actual = torch.histc(experts.to(TPU), bins=4, min=0, max=3)
    assert actual.dtype == torch.int32
    torch.testing.assert_close(actual.cpu(), expected)
