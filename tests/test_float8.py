"""float8 tensors on tpu: casts with PyTorch's rounding and saturation, copies, the ops CPU runs
on them (each allowed overload checked against CPU), CPU's refusals elsewhere, and
``torch._scaled_mm`` and ``torch._scaled_grouped_mm``."""

from __future__ import annotations

import pytest
import torch

import torch_tpu

FLOAT8 = [torch.float8_e4m3fn, torch.float8_e5m2, torch.float8_e4m3fnuz, torch.float8_e5m2fnuz]
#: MX formats' scales: powers of two only, no sign, no zero (casts take the exponent, rounded)
E8M0 = torch.float8_e8m0fnu
SPECIAL = [
    0.0,
    -0.0,
    1.0,
    1.0625,
    448.0,
    449.0,
    500.0,
    57344.0,
    1e6,
    float("inf"),
    float("-inf"),
    float("nan"),
]
SPECIAL += [-3.3, 1e-9, 2.0**-10, 2.0**-17, 0.3]


def _bits_equal(tpu: torch.Tensor, cpu: torch.Tensor) -> None:
    """Equal values (every NaN alike: XLA and c10 spell NaN with other bits)."""
    assert tpu.device.type == "tpu" and tpu.dtype == cpu.dtype and tpu.shape == cpu.shape
    got, expected = tpu.cpu(), cpu
    if cpu.dtype in FLOAT8 or cpu.dtype == E8M0:
        got, expected = got.float(), expected.float()
    torch.testing.assert_close(got, expected, rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize("dtype", [*FLOAT8, E8M0], ids=str)
@pytest.mark.parametrize("source", [torch.float32, torch.float64, torch.bfloat16, torch.float16], ids=str)
def test_casts_into_float8_round_and_saturate_as_cpu(dtype, source):
    values = torch.tensor(SPECIAL, dtype=source)
    _bits_equal(values.to("tpu").to(dtype), values.to(dtype))


@pytest.mark.parametrize("dtype", [*FLOAT8, E8M0], ids=str)
def test_integers_and_bools_cast_into_float8_as_cpu(dtype):
    for source in (torch.int32, torch.int64, torch.uint8, torch.bool):
        values = torch.tensor([0, 1, 3, 200, 500, 1000, 70000]).to(source)
        _bits_equal(values.to("tpu").to(dtype), values.to(dtype))


@pytest.mark.parametrize("dtype", [*FLOAT8, E8M0], ids=str)
def test_casts_out_of_float8_and_copies_as_cpu(dtype):
    cpu = torch.tensor(SPECIAL).to(dtype)
    tpu = cpu.to("tpu")
    assert torch.equal(tpu.cpu().view(torch.uint8), cpu.view(torch.uint8))  # (the bits travel)
    for target in (
        torch.float32,
        torch.bfloat16,
        torch.float64,
        torch.int32,
        torch.int64,
        torch.uint8,
        torch.bool,
    ):
        _bits_equal(tpu.to(target), cpu.to(target))
    _bits_equal(torch.empty(len(SPECIAL), dtype=dtype, device="tpu").copy_(cpu), cpu)
    assert tpu[2].item() == cpu[2].item() and tpu.tolist()[:3] == cpu.tolist()[:3]


def _operands(dtype):
    torch.manual_seed(0)
    return (torch.randn(4, 6) * 4).to(dtype), (torch.randn(4, 6) * 4).to(dtype)


#: a call of each overload in ``cpu_dtypes.FLOAT8_OPS`` (and the factories): CPU runs each
RUNS = {
    "abs": lambda a, b: a.abs(),
    "eq.Tensor": lambda a, b: a == b,
    "eq.Scalar": lambda a, b: a == 1.0,
    "ne.Tensor": lambda a, b: a != b,
    "ne.Scalar": lambda a, b: a != 1.0,
    "isnan": lambda a, b: a.isnan(),
    "isclose": lambda a, b: torch.isclose(a, b, rtol=0, atol=0),
    "assert_close": lambda a, b: (torch.testing.assert_close(a, a.clone()), a.new_ones(2))[1],
    "where": lambda a, b: torch.where(a.float() > 0, a, b),
    "cat": lambda a, b: torch.cat([a, b], 1),
    "stack": lambda a, b: torch.stack([a, b]),
    "clone": lambda a, b: a.clone(),
    "contiguous": lambda a, b: a.t().contiguous(),
    "views": lambda a, b: a.reshape(6, 4)[1:].permute(1, 0).clone(),
    "pad": lambda a, b: torch.nn.functional.pad(a, (1, 2)),
    "copy_": lambda a, b: a.clone().copy_(b),
    "fill_": lambda a, b: a.clone().fill_(2.5),
    "zero_": lambda a, b: a.clone().zero_(),
    "flip": lambda a, b: a.flip(0),
    "roll": lambda a, b: a.roll(1, 1),
    "repeat": lambda a, b: a.repeat(2, 1),
    "index": lambda a, b: a[torch.tensor([0, 3]).to(a.device)],
    "index_select": lambda a, b: a.index_select(1, torch.tensor([1, 4]).to(a.device)),
    "index_put": lambda a, b: a.index_put((torch.tensor([1]).to(a.device),), b[:1]),
    "masked_select": lambda a, b: a.masked_select(a.float() > 0),
    "slice_scatter": lambda a, b: a.slice_scatter(b[:2], 0, 0, 2),
    "select_scatter": lambda a, b: a.select_scatter(b[0], 0, 1),
    "like": lambda a, b: torch.stack([torch.zeros_like(a), torch.ones_like(a), torch.full_like(a, 3.0)]),
    "new": lambda a, b: torch.stack([a.new_zeros(2, 6), a.new_ones(2, 6), a.new_full((2, 6), 7.0)]),
    "factories": lambda a, b: torch.cat(
        [
            torch.zeros(1, 6, dtype=a.dtype, device=a.device),
            torch.ones(1, 6, dtype=a.dtype, device=a.device),
            torch.full((1, 6), 0.75, dtype=a.dtype, device=a.device),
            torch.eye(1, 6, dtype=a.dtype, device=a.device),
        ]
    ),
}


@pytest.mark.parametrize("dtype", FLOAT8[:2], ids=str)
@pytest.mark.parametrize("name", sorted(RUNS))
def test_ops_cpu_runs_on_float8_run_alike(dtype, name):
    a, b = _operands(dtype)
    expected = RUNS[name](a, b)
    got = RUNS[name](a.to("tpu"), b.to("tpu"))
    _bits_equal(got, expected)


#: what CPU's kernels lack for e8m0 (``pad``'s default value, 0, is not an e8m0 value: CPU's
#: overflow error)
E8M0_REFUSED = {"abs": NotImplementedError, "index_put": NotImplementedError, "pad": RuntimeError}


@pytest.mark.parametrize("name", sorted(RUNS))
def test_ops_on_e8m0_run_or_refuse_as_cpu(name):
    torch.manual_seed(0)
    a, b = ((torch.rand(4, 6) * 8 + 0.1).to(E8M0) for _ in range(2))
    if name in E8M0_REFUSED:
        for x, y in ((a, b), (a.to("tpu"), b.to("tpu"))):
            with pytest.raises(
                E8M0_REFUSED[name], match="not implemented for 'Float8_e8m0fnu'|without overflow"
            ):
                RUNS[name](x, y)
        return
    _bits_equal(RUNS[name](a.to("tpu"), b.to("tpu")), RUNS[name](a, b))


def test_e8m0_scalars_convert_as_cpu():
    """A number meeting e8m0 takes its exponent (-1 is 1), and a fill checks e8m0's range: from
    2**-127 (no zero) to 2**127."""
    cpu = torch.tensor([1.0, 2.0, 4.0]).to(E8M0)
    tpu = cpu.to("tpu")
    for call in (lambda x: x != -1, lambda x: x == 3, lambda x: x * x[:2].repeat(2)[:3]):
        _bits_equal(call(tpu), call(cpu))
    for value in (0.0, -1.0, 2.0**-128, 1e39):
        for device in ("cpu", "tpu"):
            with pytest.raises(RuntimeError, match="c10::Float8_e8m0fnu without overflow"):
                torch.full((2,), value, dtype=E8M0, device=device)
    for value in (0, -1, 3.0, float("nan")):  # (an integer's magnitude; NaN is e8m0's)
        _bits_equal(torch.full((2,), value, dtype=E8M0, device="tpu"), torch.full((2,), value, dtype=E8M0))


def test_equal_and_item():
    a, b = _operands(torch.float8_e4m3fn)
    assert torch.equal(a.to("tpu"), a.to("tpu").clone()) and not torch.equal(a.to("tpu"), b.to("tpu"))
    assert a.to("tpu")[1, 2].item() == a[1, 2].item()


@pytest.mark.parametrize(
    "call",
    [lambda a: a + a, lambda a: a.sum(), lambda a: -a, lambda a: a * 2, lambda a: a > a, lambda a: a.exp()],
)
def test_ops_cpu_refuses_on_float8_refuse_alike(call):
    a, _ = _operands(torch.float8_e4m3fn)
    with pytest.raises(NotImplementedError, match="not implemented for 'Float8_e4m3fn'"):
        call(a)
    with pytest.raises(NotImplementedError, match="not implemented for 'Float8_e4m3fn'"):
        call(a.to("tpu"))
    assert a.to("tpu").float().sum().item() == pytest.approx(a.float().sum().item())  # (still usable)


#: CPU's products in float8: computed in float32, rounded to float8 (into e4m3fn saturating)
PRODUCTS = {
    "mm": lambda a, b, c: a @ b,
    "addmm": lambda a, b, c: torch.addmm(c, a, b, beta=0.5, alpha=2),
    "mul": lambda a, b, c: a[:, :4] * c,
    "mul by a row": lambda a, b, c: a * a[:1],
    "mul by a column": lambda a, b, c: c * c[:, :1],
    "mul_": lambda a, b, c: c.clone().mul_(c),
}


@pytest.mark.parametrize("dtype", FLOAT8, ids=str)
@pytest.mark.parametrize("name", sorted(PRODUCTS))
def test_products_cpu_runs_in_float8_round_and_saturate_alike(dtype, name):
    torch.manual_seed(0)
    operands = [(torch.randn(*shape) * 20).to(dtype) for shape in ((8, 16), (16, 4), (8, 4))]
    expected = PRODUCTS[name](*operands)
    assert expected.dtype == dtype  # (e4m3fn results past 448 saturate, the fnuz ones become NaN)
    _bits_equal(PRODUCTS[name](*[x.to("tpu") for x in operands]), expected)


@pytest.mark.parametrize(
    "call",
    [
        lambda a: a * 2,
        lambda a: a * a[0, 0],
        lambda a: a * a[:1, :1],
        lambda a: a.clone().mul_(2),
        lambda a: torch.isclose(a, a),
    ],
    ids=["number", "0-dim", "one element", "in place", "isclose with tolerances"],
)
def test_float8_mul_by_one_element_is_cpus_refusal(call):
    """CPU's kernel sends a one-element ``other`` to a loop for the half types only."""
    a, _ = _operands(torch.float8_e4m3fn)
    for x in (a, a.to("tpu")):
        with pytest.raises(
            NotImplementedError, match="\"mul_cpu_reduced_float\" not implemented for 'Float8_e4m3fn'"
        ):
            call(x)


@pytest.mark.parametrize(
    "call",
    [
        lambda a: a == a.float(),
        lambda a: a * a.to(torch.float8_e5m2),
        lambda a: torch.where(a.float() > 0, a, a.float()),
    ],
    ids=["float32", "another float8", "where"],
)
def test_promoting_float8_with_another_dtype_is_cpus_error(call):
    a, _ = _operands(torch.float8_e4m3fn)
    errors = []
    for x in (a, a.to("tpu")):
        with pytest.raises(RuntimeError, match="Promotion for Float8 Types is not supported") as raised:
            call(x)
        errors.append(str(raised.value))
    assert errors[0] == errors[1]
    assert (a.to("tpu") == a[0, 0].float().to("tpu")).shape == a.shape  # (a 0-dim float32: no promotion)


# ----------------------------------------------------------------------------- _scaled_mm
def _scaled_case(rows=8, inner=32, cols=16):
    torch.manual_seed(1)
    a = (torch.randn(rows, inner) * 3).to(torch.float8_e4m3fn)
    b = (torch.randn(cols, inner) * 3).to(torch.float8_e4m3fn).t()  # (column-major, as CUDA wants)
    return a, b


def _both(a, b, scale_a, scale_b, **kwargs):
    tpu_kwargs = {k: v.to("tpu") if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()}
    expected = torch._scaled_mm(a, b, scale_a, scale_b, **kwargs)
    got = torch._scaled_mm(a.to("tpu"), b.to("tpu"), scale_a.to("tpu"), scale_b.to("tpu"), **tpu_kwargs)
    return got, expected


@pytest.mark.parametrize(
    "out_dtype", [None, torch.float32, torch.bfloat16, torch.float8_e4m3fn, torch.float8_e5m2], ids=str
)
def test_scaled_mm_tensorwise_equals_cpu(out_dtype):
    a, b = _scaled_case()
    kwargs = {} if out_dtype is None else {"out_dtype": out_dtype}
    got, expected = _both(a, b, torch.tensor(0.7), torch.tensor(1.3), **kwargs)
    # float32 results: the same products of exact float8 values, summed in another order
    tolerance = {"rtol": 1e-5, "atol": 1e-4} if expected.dtype == torch.float32 else {"rtol": 0, "atol": 0}
    assert got.dtype == expected.dtype
    torch.testing.assert_close(got.cpu().float(), expected.float(), **tolerance)


def test_scaled_mm_rowwise_with_bias_and_scale_result():
    a, b = _scaled_case()
    rows, cols = torch.rand(8, 1) + 0.5, torch.rand(1, 16) + 0.5
    got, expected = _both(a, b, rows, cols, bias=torch.randn(16).bfloat16(), out_dtype=torch.bfloat16)
    torch.testing.assert_close(got.cpu(), expected, rtol=0, atol=0)
    got, expected = _both(
        a,
        b,
        torch.tensor(0.5),
        torch.tensor(2.0),
        scale_result=torch.tensor(4.0),
        out_dtype=torch.float8_e4m3fn,
    )
    torch.testing.assert_close(got.cpu().float(), expected.float(), rtol=0, atol=0)


def test_scaled_mm_saturates_a_float8_result():
    a, b = _scaled_case()
    got, expected = _both(a, b, torch.tensor(100.0), torch.tensor(100.0))
    assert expected.float().abs().max() == 448.0
    torch.testing.assert_close(got.cpu().float(), expected.float(), rtol=0, atol=0)


def test_scaled_mm_in_fused_and_compiled_code():
    a, b = _scaled_case()
    sa, sb = torch.tensor(0.25), torch.tensor(0.5)
    expected = torch._scaled_mm(a, b, sa, sb, out_dtype=torch.float32).relu()

    def f(x, y, s, t):
        return torch._scaled_mm(x.to(torch.float8_e4m3fn), y, s, t, out_dtype=torch.float32).relu()

    args = (a.float().to("tpu"), b.to("tpu"), sa.to("tpu"), sb.to("tpu"))
    with torch_tpu.eager_mode("fused"):
        fused = f(*args).cpu()
    compiled = torch.compile(f, backend="tpu")(*args).cpu()
    for got in (fused, compiled):
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-4)


def test_scaled_mm_bad_scales_raise_cpu_error():
    a, b = _scaled_case()
    errors = []
    for device in ("cpu", "tpu"):
        with pytest.raises(ValueError, match="Invalid scaling configuration") as raised:
            torch._scaled_mm(
                a.to(device), b.to(device), torch.rand(8, device=device), torch.tensor(1.0, device=device)
            )
        errors.append(str(raised.value))
    assert errors[0] == errors[1]
    with pytest.raises(RuntimeError, match="mat_a and mat_b shapes cannot be multiplied"):
        torch._scaled_mm(
            a.to("tpu"), b[:16].to("tpu"), torch.tensor(1.0, device="tpu"), torch.tensor(1.0, device="tpu")
        )


# ----------------------------------------------------------------------------- _scaled_grouped_mm
# PyTorch has no CPU kernel: the reference is CPU's ``_scaled_mm`` of each group, row-wise scaled
# into bfloat16. tpu sums the same exact float8 products in float32 in another order, so a bfloat16
# result may round one ulp apart.
ENDS = [3, 3, 9, 12]  # 4 groups, one empty, 4 rows (or columns) past the last end
GROUPS, M, K, N = len(ENDS), 16, 32, 24
ONE_ULP = {"rtol": 2.0**-8, "atol": 0}


def _float8(*shape):
    return (torch.randn(*shape) * 3).to(torch.float8_e4m3fn)


def _scales(*shape):
    return torch.rand(*shape) + 0.5


def _groups():
    return list(zip([0, *ENDS[:-1]], ENDS))


def _rowwise(a, b, scale_a, scale_b):
    """CPU's ``_scaled_mm`` of one group (empty groups give an empty product)."""
    if a.shape[0] == 0 or b.shape[1] == 0 or a.shape[1] == 0:
        return torch.zeros(a.shape[0], b.shape[1], dtype=torch.bfloat16)
    return torch._scaled_mm(
        a.contiguous(), b.t().contiguous().t(), scale_a[:, None], scale_b[None, :], out_dtype=torch.bfloat16
    )


def _grouped_case(layout: str):
    """Operands, scales and offsets of one of the four layouts, and CPU's result."""
    torch.manual_seed(2)
    offs = torch.tensor(ENDS, dtype=torch.int32)
    if layout == "2d-3d":  # groups of rows of a, each times its own matrix of b (MoE experts)
        a, b = _float8(M, K), _float8(GROUPS, N, K).transpose(-2, -1)
        scale_a, scale_b = _scales(M), _scales(GROUPS, N)
        expected = torch.zeros(M, N, dtype=torch.bfloat16)
        for g, (s, e) in enumerate(_groups()):
            expected[s:e] = _rowwise(a[s:e], b[g], scale_a[s:e], scale_b[g])
    elif layout == "3d-3d":
        a, b = _float8(GROUPS, M, K), _float8(GROUPS, N, K).transpose(-2, -1)
        scale_a, scale_b, offs = _scales(GROUPS, M), _scales(GROUPS, N), None
        expected = torch.stack([_rowwise(a[g], b[g], scale_a[g], scale_b[g]) for g in range(GROUPS)])
    elif layout == "3d-2d":  # groups of columns of b, each times its own matrix of a
        a, b = _float8(GROUPS, M, K), _float8(N, K).t()
        scale_a, scale_b = _scales(GROUPS, M), _scales(N)
        expected = torch.zeros(M, N, dtype=torch.bfloat16)
        for g, (s, e) in enumerate(_groups()):
            expected[:, s:e] = _rowwise(a[g], b[:, s:e], scale_a[g], scale_b[s:e])
    else:  # "2d-2d": groups along the contraction (the weight gradient), each with its own scales
        a, b = _float8(M, K), _float8(N, K).t()
        scale_a, scale_b = _scales(GROUPS * M), _scales(GROUPS * N)
        expected = torch.zeros(GROUPS, M, N, dtype=torch.bfloat16)
        for g, (s, e) in enumerate(_groups()):
            rows, cols = scale_a[g * M : (g + 1) * M], scale_b[g * N : (g + 1) * N]
            expected[g] = _rowwise(a[:, s:e], b[s:e], rows, cols)
    return (a, b, scale_a, scale_b), offs, expected


def _on_tpu(args, offs):
    return [x.to("tpu") for x in args], None if offs is None else offs.to("tpu")


@pytest.mark.parametrize("layout", ["2d-3d", "3d-3d", "3d-2d", "2d-2d"])
def test_scaled_grouped_mm_equals_cpus_scaled_mm_per_group(layout):
    args, offs, expected = _grouped_case(layout)
    tpu_args, tpu_offs = _on_tpu(args, offs)
    got = torch._scaled_grouped_mm(*tpu_args, offs=tpu_offs)
    assert got.dtype == torch.bfloat16 and got.shape == expected.shape
    torch.testing.assert_close(got.cpu(), expected, **ONE_ULP)


def test_scaled_grouped_mm_in_fused_and_compiled_code():
    args, offs, expected = _grouped_case("2d-3d")
    tpu_args, tpu_offs = _on_tpu(args, offs)

    def f(a, b, scale_a, scale_b, offs):
        return torch._scaled_grouped_mm(a, b, scale_a, scale_b, offs=offs, out_dtype=torch.bfloat16).relu()

    with torch_tpu.eager_mode("fused"):
        fused = f(*tpu_args, tpu_offs).cpu()
    compiled = torch.compile(f, backend="tpu")(*tpu_args, tpu_offs).cpu()
    for got in (fused, compiled):
        torch.testing.assert_close(got, expected.relu(), **ONE_ULP)


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda a, b, sa, sb, offs: (a.float(), b, sa, sb, offs), "Expected inputs of E4M3 FP8 type"),
        (lambda a, b, sa, sb, offs: (a, b, sa[:-1], sb, offs), "Expected scale_a to have 16 elements"),
        (lambda a, b, sa, sb, offs: (a, b, sa, sb[:, :-1], offs), "scale_b non-batch dimension to be 24"),
        (lambda a, b, sa, sb, offs: (a, b, sa.double(), sb, offs), "scales must both be float32"),
        (lambda a, b, sa, sb, offs: (a, b, sa, sb, None), "Offsets tensor not provided"),
        (lambda a, b, sa, sb, offs: (a, b, sa, sb, offs.long()), r"must be integer \(int32\)"),
    ],
)
def test_scaled_grouped_mm_bad_arguments_raise_pytorchs_error(change, message):
    """The meta kernel's errors (CUDA's checks; CPU has no kernel), in its words."""
    args, offs, _ = _grouped_case("2d-3d")
    for device in ("meta", "tpu"):
        a, b, sa, sb, o = change(*[x.to(device) for x in args], offs.to(device))
        with pytest.raises(RuntimeError, match=message):
            torch._scaled_grouped_mm(a, b, sa, sb, offs=o)
    a, b, sa, sb = _on_tpu(args, offs)[0]
    assert torch._scaled_grouped_mm(a, b, sa, sb, offs=offs.to("tpu")).isfinite().all()  # (still usable)
