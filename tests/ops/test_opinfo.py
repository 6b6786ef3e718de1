"""Every tpu lowering validated against PyTorch CPU on OpInfo samples.

For each OpInfo and each dtype tpu supports, a few samples run on CPU and on tpu: forward values
and dtypes must match (``torch.testing.assert_close``), the derived in-place variant too, and for
float32 the gradients (``torch.autograd.grad``) as well. Samples that reach an op with no tpu
lowering are skipped (the coverage table in docs/ops.md tracks them); a mismatch fails unless
``expectations.py`` says why.

Tolerances come from a float64 reference (``torch_tpu.testing.reference``): a float32, complex64
or half-precision sample runs once more on CPU widened to float64 (complex128), and tpu may
differ from CPU by a few times CPU's own distance from that result, so tpu must be about as
close to the exact answer as CPU is, whatever the machine's rounding.
"""

from __future__ import annotations

import pytest
import torch
from torch.testing._internal.common_methods_invocations import op_db
from torch.utils._pytree import tree_flatten, tree_map

import torch_tpu
from torch_tpu.testing.reference import WIDER, derived_tolerance, widened

from .expectations import (
    CPU_ARGUMENT_OPS,
    RANDOM_OPS,
    RANDOM_SAMPLES,
    SIGN_FREE_OPS,
    TIE_BREAK_OPS,
    TOLERANCES,
    XFAILS,
)

DTYPES = (
    torch.float32,
    torch.float64,
    torch.bfloat16,
    torch.float16,
    torch.int64,
    torch.int32,
    torch.int16,
    torch.int8,
    torch.uint8,
    torch.bool,
    torch.complex64,
    torch.complex128,
    torch.uint16,
    torch.uint32,
    torch.uint64,
)
# Samples per OpInfo: float32 (and the backward check) see more; other dtypes mostly exercise
# the same lowering through a different dtype. Keeps the suite within the CI budget on 2 cores.
SAMPLES_PER_OP = {torch.float32: 3}
OTHER_DTYPE_SAMPLES = 1


def _name(op) -> str:
    return f"{op.name}.{op.variant_test_name}" if op.variant_test_name else op.name


def _dense(op) -> bool:
    """Sparse-layout OpInfos test sparse kernels, which tpu (dense XLA arrays) does not have."""
    return not (op.name.startswith("sparse.") or "to_sparse" in op.name)


OPS = [op for op in op_db if _dense(op)]


def _cases():
    for op in OPS:
        supported = op.supported_dtypes("cpu")
        for dtype in DTYPES:
            if dtype in supported:
                yield pytest.param(op, dtype, id=f"{_name(op)}-{str(dtype)[6:]}")


def _to_tpu(x):
    if isinstance(x, torch.Tensor):
        moved = x.detach().to("tpu")
        return moved.requires_grad_(x.requires_grad) if x.is_leaf else moved
    return x


def _cloned(x):
    return x.clone() if isinstance(x, torch.Tensor) else x


def _host_copy(x):
    return x.cpu() if isinstance(x, torch.Tensor) else x


def _samples(op, dtype, requires_grad=False, count=None):
    samples = op.sample_inputs("cpu", dtype, requires_grad=requires_grad)
    count = count or SAMPLES_PER_OP.get(dtype, OTHER_DTYPE_SAMPLES)
    return [s for _, s in zip(range(count), samples)]


def _call(fn, sample, move, name=None):
    if name in CPU_ARGUMENT_OPS:
        args = (move(sample.input), sample.args, sample.kwargs)
    else:
        args = tree_map(move, (sample.input, sample.args, sample.kwargs))
    return fn(args[0], *args[1], **args[2]), args


def _reference(fn, sample, op, dtype):
    """``fn(sample)`` computed on CPU with float32/half (complex64) tensors and dtypes widened
    to float64 (complex128): what the comparisons measure CPU's rounding against. None where
    the op does not take the wider dtype or fails with it."""
    if dtype not in WIDER or WIDER[dtype] not in op.supported_dtypes("cpu"):
        return None
    try:
        return fn(sample, widened)
    except Exception:  # noqa: BLE001  (the comparison then uses the plain tolerance)
        return None


def _tolerance(name, dtype, expected, reference=None):
    """The ``assert_close`` tolerance for one result leaf: the table's entry for the op (or
    ``assert_close``'s default for the leaf's dtype) as the unit, scaled by how far CPU's result
    is from the float64 ``reference``."""
    entries = TOLERANCES.get(name, ())
    entries = entries if isinstance(entries, tuple) else (entries,)
    for tolerance in (*entries, TOLERANCES["default-half"]):
        if tolerance.dtypes is None or dtype in tolerance.dtypes:
            return derived_tolerance(expected, reference, tolerance.atol, tolerance.rtol)
    return derived_tolerance(expected, reference)


def _random(name, sample) -> bool:
    return name in RANDOM_OPS or (name in RANDOM_SAMPLES and RANDOM_SAMPLES[name](sample))


def _compare(actual, expected, name, dtype, what, random=False, reference=None):
    """tpu's ``actual`` against CPU's ``expected`` leaf by leaf, each with the tolerance derived
    from the matching leaf of the float64 ``reference`` (None: the plain tolerance)."""
    actual_leaves, _ = tree_flatten(actual)
    expected_leaves, _ = tree_flatten(expected)
    reference_leaves, _ = tree_flatten(reference)
    assert len(actual_leaves) == len(expected_leaves), f"{what}: output structure differs"
    if len(reference_leaves) != len(expected_leaves):
        reference_leaves = [None] * len(expected_leaves)
    for a, e, r in zip(actual_leaves, expected_leaves, reference_leaves):
        if not isinstance(e, torch.Tensor):
            if isinstance(e, (int, float, bool, complex)) and isinstance(a, type(e)):
                torch.testing.assert_close(
                    a, e, equal_nan=True, msg=lambda m: f"{what}: {m}", **_tolerance(name, dtype, e, r)
                )
            continue
        assert isinstance(a, torch.Tensor), f"{what}: expected a tensor, got {type(a)}"
        assert a.device.type == "tpu" or e.device.type == "cpu", f"{what}: result on {a.device}"
        if random:
            assert (a.shape, a.dtype) == (e.shape, e.dtype), f"{what}: shape/dtype differ"
            continue
        torch.testing.assert_close(
            a.cpu(), e, equal_nan=True, msg=lambda m: f"{what}: {m}", **_tolerance(name, dtype, e, r)
        )


def _gathered(source, indices, dim):
    """``source`` at ``indices`` along ``dim`` (a keepdim=False index gets its dim back)."""
    reduced = indices.dim() < source.dim()
    picked = torch.gather(source, dim, indices.unsqueeze(dim) if reduced else indices)
    return picked.squeeze(dim) if reduced else picked


def _resolve_ties(actual, expected, sample, dim_position, what):
    """For TIE_BREAK_OPS: check tpu's indices by what they select from the input; return the
    outputs left to compare (the values, or for argsort what each side's indices select)."""
    if sample.kwargs.get("stable"):  # a stable sort has one right answer
        return actual, expected
    args = sample.args
    dim = sample.kwargs.get("dim", args[dim_position] if len(args) > dim_position else -1)
    if isinstance(expected, torch.Tensor):  # argsort: indices only
        assert (actual.shape, actual.dtype) == (expected.shape, expected.dtype), (
            f"{what}: indices' shape/dtype differ"
        )
        return _gathered(sample.input, actual.cpu(), dim), _gathered(sample.input, expected, dim)
    (values, indices), (expected_values, expected_indices) = actual, expected
    assert (indices.shape, indices.dtype) == (expected_indices.shape, expected_indices.dtype), (
        f"{what}: indices' shape/dtype differ"
    )
    torch.testing.assert_close(
        _gathered(sample.input, indices.cpu(), dim),
        values.cpu(),
        rtol=0,
        atol=0,
        equal_nan=True,
        msg=lambda m: f"{what}: indices do not select the values: {m}",
    )
    return values, expected_values


def _run_or_skip(fn):
    """Run ``fn``; skip when it reaches an op tpu has no lowering for (tracked in docs/ops.md) or
    produces a dtype tpu does not have (complex32: a documented clear TypeError)."""
    try:
        return fn()
    except NotImplementedError as e:
        if "has no tpu lowering" in str(e):
            pytest.skip(str(e).split(".")[0])
        raise
    except TypeError as e:
        if str(e).startswith("tpu does not support dtype"):
            pytest.skip(str(e).split(";")[0])
        raise


def _with_expectations(name, dtype, check, backward=False):
    """Run ``check``; an XFAIL entry must still fail (strict), so stale entries surface."""
    xfail = XFAILS.get(name)
    phase = "backward" if backward else "forward"
    if not (xfail and (xfail.dtypes is None or dtype in xfail.dtypes) and phase in xfail.phases):
        return check()
    try:
        check()
    except (AssertionError, RuntimeError, TypeError, ValueError, IndexError):
        pytest.xfail(xfail.reason)
    pytest.fail(f"{name} ({dtype}) now matches CPU: remove its XFAILS entry")


@pytest.mark.parametrize("op, dtype", list(_cases()))
def test_forward(op, dtype):
    # an op with an expected failure sees float32's sample count in every dtype, so the samples
    # the failure was found on keep running (and a stale entry keeps surfacing)
    samples = SAMPLES_PER_OP[torch.float32] if _name(op) in XFAILS else None
    _with_expectations(_name(op), dtype, lambda: _check_forward(op, dtype, samples))


@pytest.mark.parametrize(
    "op", [pytest.param(op, id=_name(op)) for op in OPS if torch.float32 in op.supported_dtypes("cpu")]
)
def test_forward_fused(op):
    """Every op once more in fused eager (recorded into a graph, run at the comparison's host
    read), float32, first sample and its in-place variant."""
    name = _name(op)
    with torch_tpu.eager_mode("fused"):
        if name not in XFAILS:
            return _check_forward(op, torch.float32, samples=1)
        try:  # an expected failure may pass on the first sample alone: not strict here
            _check_forward(op, torch.float32, samples=1)
        except (AssertionError, RuntimeError, TypeError, ValueError, IndexError):
            pytest.xfail(XFAILS[name].reason)


def _check_inplace(op, sample, name, dtype, random) -> bool:
    """Compare the in-place variant on this sample; False if CPU rejects it (e.g. broadcasting)."""
    inplace = op.inplace_variant
    if inplace is None or not isinstance(sample.input, torch.Tensor):
        return True
    try:
        expected, _ = _call(inplace, sample, _cloned)
    except Exception:  # noqa: BLE001
        return False
    actual, _ = _run_or_skip(lambda: _call(inplace, sample, _to_tpu, name))
    reference = (
        None
        if random
        else _reference(lambda s, widen: _call(inplace, s, lambda x: widen(_cloned(x)))[0], sample, op, dtype)
    )
    _compare(actual, expected, name, dtype, f"{name} in-place", random, reference)
    return True


def _check_forward(op, dtype, samples=None):
    name = _name(op)
    ran = 0
    inplace_checked = False
    for sample in _samples(op, dtype, count=samples):
        try:
            expected, _ = _call(op, sample, lambda x: x)
        except Exception:  # noqa: BLE001  (a sample CPU rejects says nothing about tpu)
            continue
        actual, _ = _run_or_skip(lambda: _call(op, sample, _to_tpu, name))
        _run_or_skip(lambda: tree_map(_host_copy, actual))  # views can make unsupported dtypes
        random = _random(name, sample)
        # ties resolve differently in float64: their values are compared exactly anyway
        reference = (
            None
            if random or name in TIE_BREAK_OPS
            else _reference(lambda s, widen: _call(op, s, widen)[0], sample, op, dtype)
        )
        if name in SIGN_FREE_OPS:
            sign_free = sample.output_process_fn_grad
            actual, expected = sign_free(actual), sign_free(expected)
            reference = None if reference is None else sign_free(reference)
        if name in TIE_BREAK_OPS:
            actual, expected = _resolve_ties(actual, expected, sample, TIE_BREAK_OPS[name], f"{name} forward")
        _compare(actual, expected, name, dtype, f"{name} forward", random, reference)
        ran += 1
        if not inplace_checked:  # derived by the dispatcher: one sample per dtype suffices
            inplace_checked = _check_inplace(op, sample, name, dtype, random)
    if not ran:
        pytest.skip("no sample runs on CPU for this dtype")


def _grad_inputs(args):
    leaves, _ = tree_flatten(args)
    return [x for x in leaves if isinstance(x, torch.Tensor) and x.requires_grad]


def _grads(op, sample, move):
    out, args = _call(op, sample, move, _name(op))
    out = sample.output_process_fn_grad(out)
    outputs = [
        o
        for o in tree_flatten(out)[0]
        if isinstance(o, torch.Tensor) and o.requires_grad and o.dtype.is_floating_point
    ]
    inputs = _grad_inputs(args)
    if not outputs or not inputs:
        return None
    # a fixed, non-uniform cotangent catches more than ones_like (built in float32, so the
    # float64 reference's is the same numbers)
    cotangents = [torch.linspace(-1, 1, o.numel()).to(o.dtype).reshape(o.shape).to(o.device) for o in outputs]
    return torch.autograd.grad(outputs, inputs, cotangents, allow_unused=True)


@pytest.mark.parametrize(
    "op",
    [op for op in OPS if op.supports_autograd and torch.float32 in op.supported_dtypes("cpu")],
    ids=_name,
)
def test_backward(op):
    if _name(op) in RANDOM_OPS:
        pytest.skip("random op: gradients depend on the random values")
    _with_expectations(_name(op), torch.float32, lambda: _check_backward(op), backward=True)


def _check_backward(op):
    name = _name(op)
    ran = 0
    for sample in _samples(op, torch.float32, requires_grad=True):
        if _random(name, sample):
            continue  # gradients through random values
        try:
            expected = _grads(op, sample, lambda x: x)
        except Exception:  # noqa: BLE001
            continue
        if expected is None:
            continue
        actual = _run_or_skip(lambda: _grads(op, sample, _to_tpu))
        reference = _reference(lambda s, widen: _grads(op, s, widen), sample, op, torch.float32)
        for i, (a, e) in enumerate(zip(actual, expected)):
            if e is None:
                continue
            assert a is not None, f"{name}: tpu produced no gradient where CPU did"
            r = None if reference is None else reference[i]
            torch.testing.assert_close(
                a.cpu(),
                e,
                equal_nan=True,
                msg=lambda m: f"{name} backward: {m}",
                **_tolerance(name, torch.float32, e, r),
            )
        ran += 1
    if not ran:
        pytest.skip("no differentiable sample")
