"""Reductions, scans, sorts and order statistics.

PyTorch's dtype rules: sums and products of integers/bools return int64, ``dtype=`` casts the
input first, float16/bfloat16 accumulate in float32 (torch's opmath), means and norms need a
floating input. ``dim=None`` or ``[]`` reduce every dim. Index results are int64 and pick the
element a sequential CPU kernel picks (first maximum, stable sort order, last mode).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from ..runtime.buffer import apply
from ._helpers import accumulator, has_values, input_dtype, report_values, structured_out, type_name
from ._nn_helpers import require
from .padding import SCAN, Reduce
from .registry import OutDtype, Promote, lower, runtime

aten = __import__("torch").ops.aten
INDEX = jnp.int64


# ----------------------------------------------------------------------------- dims and dtypes
_MAX_DIMS = 64


def _dims(x: jax.Array, dim) -> tuple[int, ...]:
    """Reduction dims in ``[0, ndim)``, sorted; ``None`` or ``[]`` mean every dim."""
    if x.ndim > _MAX_DIMS:  # TensorIterator's limit, which every CPU reduction goes through
        raise RuntimeError(f"only tensors with up to {_MAX_DIMS} dims are supported")
    if dim is None or dim == ():
        return tuple(range(x.ndim))
    dims = (dim,) if isinstance(dim, int) else dim
    rank = max(x.ndim, 1)  # a 0-dim tensor accepts dim 0 and -1
    for d in dims:
        if not -rank <= d < rank:
            raise IndexError(
                f"Dimension out of range (expected to be in range of [{-rank}, {rank - 1}], but got {d})"
            )
    normalized = [d % rank for d in dims]
    for i, d in enumerate(normalized):
        if d in normalized[:i]:
            raise RuntimeError(f"dim {d} appears multiple times in the list of dims")
    return tuple(sorted(normalized)) if x.ndim else ()


def _dim(x: jax.Array, dim: int) -> int | None:
    """One dim in ``[0, ndim)``; None for a 0-dim tensor (whose only "dim" is itself)."""
    dims = _dims(x, (dim,))
    return dims[0] if dims else None


def _nonempty(x: jax.Array, dims: tuple[int, ...], name: str) -> None:
    for d in dims:
        if x.shape[d] == 0:
            raise IndexError(f"{name}(): Expected reduction dim {d} to have non-zero size.")


def _is_integral(dtype) -> bool:
    return not jnp.issubdtype(dtype, jnp.inexact)


def _real(dtype) -> np.dtype:
    return np.dtype(jnp.finfo(dtype).dtype)


def _sum_dtype(x_dtype, dtype) -> np.dtype:
    """Result dtype of sum/prod/cumsum: ``dtype`` if given, int64 for integers and bools."""
    if dtype is not None:
        return np.dtype(dtype)
    return np.dtype(jnp.int64) if _is_integral(x_dtype) else np.dtype(x_dtype)


def _float_dtype(name: str, x_dtype, dtype) -> np.dtype:
    """Result dtype of mean-like ops, which cannot infer one for integer inputs."""
    result = np.dtype(dtype if dtype is not None else x_dtype)
    if _is_integral(result):
        which = "Optional" if dtype is not None else "Input"
        raise RuntimeError(
            f"{name}(): could not infer output dtype. {which} dtype must be either "
            f"a floating point or complex dtype. Got: {type_name(result)}"
        )
    return result


def _require_float(x: jax.Array, message: str) -> None:
    if _is_integral(x.dtype):
        raise RuntimeError(f"{message} Got {type_name(x.dtype)}")


def _count(x: jax.Array, dims: tuple[int, ...]) -> int:
    return math.prod(x.shape[d] for d in dims)


def _keep_all(out: jax.Array, ndim: int, keepdim: bool) -> jax.Array:
    """A full reduction's scalar, as shape ``[1] * ndim`` when ``keepdim``."""
    return out.reshape((1,) * ndim) if keepdim else out


# ----------------------------------------------------------------------------- sum / mean / prod
def _accumulate(reduce, x, dim, keepdim, result):
    wide = x.astype(accumulator(result))
    return reduce(wide, axis=_dims(x, dim), keepdims=keepdim).astype(result)


@lower(aten.sum.dim_IntList, pad=Reduce("sum"))
def sum_dim(x, dim, keepdim=False, dtype=None):
    return _accumulate(jnp.sum, x, dim, keepdim, _sum_dtype(x.dtype, dtype))


@lower(aten.sum.default, pad=Reduce("sum"))
def sum_all(x, dtype=None):
    return sum_dim(x, None, False, dtype)


@lower(aten.nansum.default, pad=Reduce("sum"))
def nansum(x, dim=None, keepdim=False, dtype=None):
    return _accumulate(jnp.nansum, x, dim, keepdim, _sum_dtype(x.dtype, dtype))


@lower(aten.prod.dim_int, pad=Reduce("prod"))
def prod_dim(x, dim, keepdim=False, dtype=None):
    return _accumulate(jnp.prod, x, (dim,), keepdim, _sum_dtype(x.dtype, dtype))


@lower(aten.prod.default, pad=Reduce("prod"))
def prod_all(x, dtype=None):
    return _accumulate(jnp.prod, x, None, False, _sum_dtype(x.dtype, dtype))


@lower(aten.mean.dim, pad=Reduce("static"))
def mean_dim(x, dim, keepdim=False, dtype=None):
    return _accumulate(jnp.mean, x, dim, keepdim, _float_dtype("mean", x.dtype, dtype))


@lower(aten.mean.default, pad=Reduce("static"))
def mean_all(x, dtype=None):
    return mean_dim(x, None, False, dtype)


# ----------------------------------------------------------------------------- var / std
def _var_mean(x, dim, correction, keepdim):
    if _is_integral(x.dtype):
        raise RuntimeError("std and var only support floating point and complex dtypes")
    dims = _dims(x, dim)
    wide = x.astype(accumulator(x.dtype))
    mean = jnp.mean(wide, axis=dims, keepdims=True)
    squares = jnp.sum(jnp.square(jnp.abs(wide - mean)), axis=dims, keepdims=keepdim)
    correction = 1 if correction is None else correction
    var = squares / jnp.maximum(_count(x, dims) - correction, 0)
    mean = mean if keepdim else jnp.squeeze(mean, dims)
    return var.astype(_real(x.dtype)), mean.astype(x.dtype)


@lower(aten.var.correction)
def var(x, dim=None, correction=None, keepdim=False):
    return _var_mean(x, dim, correction, keepdim)[0]


@lower(aten.std.correction)
def std(x, dim=None, correction=None, keepdim=False):
    return jnp.sqrt(var(x, dim, correction, keepdim))


@lower(aten.var_mean.correction)
def var_mean(x, dim=None, correction=None, keepdim=False):
    return _var_mean(x, dim, correction, keepdim)


@lower(aten.std_mean.correction)
def std_mean(x, dim=None, correction=None, keepdim=False):
    variance, mean = _var_mean(x, dim, correction, keepdim)
    return jnp.sqrt(variance), mean


# ----------------------------------------------------------------------------- max / min / arg
def _extreme(name, reduce):
    """``max``/``min`` over everything: an error on empty inputs (there is no identity)."""

    def full(x):
        _refuse_empty(x, name)
        return reduce(x)

    return full


def _refuse_empty(x: jax.Array, name: str) -> None:
    if x.size == 0:
        raise RuntimeError(
            f"{name}(): Expected reduction dim to be specified for input.numel() == 0. "
            "Specify the reduction dim with the 'dim' argument."
        )


def _extreme_dim(name, reduce, arg):
    """``max.dim``/``min.dim``: values and the index of the first extreme (NaN wins)."""

    def along(x, dim, keepdim=False):
        axis = _dim(x, dim)
        if axis is None:
            return x, jnp.zeros((), INDEX)
        _nonempty(x, (axis,), name)
        return (reduce(x, axis=axis, keepdims=keepdim), arg(x, axis=axis, keepdims=keepdim).astype(INDEX))

    return along


#: amax/amin's rule: CPU's meta function words it
_SAME_AS_INPUT = OutDtype(
    input_dtype,
    lambda want, got: (
        f"Expected the dtype for input and out to match, but got {type_name(want)} for input's dtype "
        f"and {type_name(got)} for out's dtype."
    ),
)


def _extreme_dims(name, reduce):
    """``amax``/``amin``: several dims, no indices."""

    def over(x, dim=(), keepdim=False):
        dims = _dims(x, dim)
        if not dim:  # every dim: CPU asks for one when there are no elements
            _refuse_empty(x, name)
        _nonempty(x, dims, name)
        return reduce(x, axis=dims, keepdims=keepdim)

    return over


def _arg_extreme(name, arg):
    """``argmax``/``argmin``: ``dim=None`` flattens (``keepdim`` then keeps every dim as 1)."""

    def index(x, dim=None, keepdim=False):
        if x.dtype == jnp.bool_:
            raise RuntimeError(f"{name}(): does not support bool input")
        if dim is None:
            if x.size == 0:
                raise IndexError(f"{name}(): Expected reduction dim to be specified for input.numel() == 0.")
            return _keep_all(arg(x.reshape(-1)).astype(INDEX), x.ndim, keepdim)
        axis = _dim(x, dim)
        if axis is None:
            return jnp.zeros((), INDEX)
        _nonempty(x, (axis,), name)
        return arg(x, axis=axis, keepdims=keepdim).astype(INDEX)

    return index


for _name, _reduce, _arg in [("max", jnp.max, jnp.argmax), ("min", jnp.min, jnp.argmin)]:
    _packet = getattr(aten, _name)
    lower(_packet.default, pad=Reduce(_name))(_extreme(_name, _reduce))
    lower(_packet.dim, pad=Reduce(_name, indices=True))(_extreme_dim(_name, _reduce, _arg))
    lower(getattr(aten, "a" + _name).default, out_dtype=_SAME_AS_INPUT, pad=Reduce(_name))(
        _extreme_dims("a" + _name, _reduce)
    )
    lower(getattr(aten, "arg" + _name).default, pad=Reduce(_name, indices=True))(
        _arg_extreme("arg" + _name, _arg)
    )


@lower(aten.aminmax.default, out_dtype=structured_out(input_dtype))
def aminmax(x, dim=None, keepdim=False):
    if dim is None:
        _dims(x, None)  # the rank limit
        if x.size == 0:
            raise RuntimeError(
                "aminmax(): cannot compute aminmax over an empty dimension as the operation has no identity."
            )
        return _keep_all(jnp.min(x), x.ndim, keepdim), _keep_all(jnp.max(x), x.ndim, keepdim)
    dims = _dims(x, (dim,))
    for d in dims:
        if x.shape[d] == 0:
            raise IndexError(f"aminmax: Expected reduction dim {d} to have non-zero size.")
    return jnp.min(x, axis=dims, keepdims=keepdim), jnp.max(x, axis=dims, keepdims=keepdim)


# ----------------------------------------------------------------------------- all / any / count
def _logical(reduce):
    """``all``/``any``: bool results, except uint8 inputs give uint8 (a torch legacy rule)."""

    def over(x, dim=None, keepdim=False):
        out = reduce(x.astype(bool), axis=_dims(x, dim), keepdims=keepdim)
        return out.astype(jnp.uint8) if x.dtype == jnp.uint8 else out

    return over


for _name, _reduce in [("all", jnp.all), ("any", jnp.any)]:
    _packet = getattr(aten, _name)
    lower(_packet.default, _packet.dim, _packet.dims)(_logical(_reduce))


@lower(aten.count_nonzero.dim_IntList)
def count_nonzero_dims(x, dim):
    return jnp.sum(x != 0, axis=_dims(x, dim), dtype=INDEX)


@lower(aten.count_nonzero.default)
def count_nonzero(x, dim=None):
    return count_nonzero_dims(x, () if dim is None else (dim,))


# ----------------------------------------------------------------------------- norms
def _vector_norm(x, ord, dims, keepdim):
    """``sum(|x|**ord)**(1/ord)`` with the limits torch uses for 0 and +-inf."""
    magnitude = jnp.abs(x)
    if ord in (math.inf, -math.inf):
        if any(x.shape[d] == 0 for d in dims) or (not dims and x.size == 0):
            raise RuntimeError(
                "linalg.vector_norm cannot compute the inf norm on an empty tensor "
                "because the operation does not have an identity"
            )
        return (jnp.max if ord > 0 else jnp.min)(magnitude, axis=dims, keepdims=keepdim)
    if ord == 0:
        return jnp.sum(magnitude != 0, axis=dims, keepdims=keepdim).astype(x.dtype)
    if ord == 1:
        return jnp.sum(magnitude, axis=dims, keepdims=keepdim)
    if ord == 2:
        return jnp.sqrt(jnp.sum(jnp.square(magnitude), axis=dims, keepdims=keepdim))
    return jnp.sum(magnitude**ord, axis=dims, keepdims=keepdim) ** (1.0 / ord)


@lower(aten.linalg_vector_norm.default, static=("ord",))
def linalg_vector_norm(x, ord=2, dim=None, keepdim=False, dtype=None):
    _require_float(x, "linalg.vector_norm: Expected a floating point or complex tensor as input.")
    if dtype is not None:
        x = x.astype(dtype)
    result = _real(x.dtype)
    wide = x.astype(accumulator(x.dtype))
    return _vector_norm(wide, float(ord), _dims(x, dim), keepdim).astype(result)


@lower(aten.norm.ScalarOpt_dim, aten.norm.ScalarOpt_dim_dtype, static=("p",))
def norm_dim(x, p, dim, keepdim=False, dtype=None):
    return linalg_vector_norm(x, 2 if p is None else p, dim, keepdim, dtype)


@lower(aten.norm.Scalar, aten.norm.ScalarOpt_dtype, static=("p",))
def norm(x, p=2, dtype=None):
    return norm_dim(x, p, (), False, dtype)


@lower(aten._foreach_norm.Scalar, static=("ord",))
def foreach_norm(xs, ord=2, dtype=None):
    return [linalg_vector_norm(x, ord, None, False, dtype) for x in xs]


@lower(aten.logsumexp.default, promote=Promote.INT_TO_FLOAT, promote_args=("self",), pad=Reduce("max"))
def logsumexp(x, dim, keepdim=False, *, types):
    x = x.astype(types.result)  # integers in the default float dtype
    dims = _dims(x, dim)
    wide = x.astype(accumulator(x.dtype))
    # torch shifts complex inputs by the largest real part, leaving log on its principal branch
    peak = jnp.max(jnp.real(wide), axis=dims, keepdims=True, initial=-jnp.inf)
    peak = jnp.where(jnp.isfinite(peak), peak, 0)  # all -inf (or +inf) slices: no shift
    out = jnp.log(jnp.sum(jnp.exp(wide - peak), axis=dims, keepdims=True)) + peak
    return (out if keepdim else jnp.squeeze(out, dims)).astype(x.dtype)


# ----------------------------------------------------------------------------- scans
def _scan(fn):
    """A cumulative op along ``dim``; a 0-dim tensor is its own prefix."""

    def along(x, dim, dtype=None):
        result = _sum_dtype(x.dtype, dtype)
        axis = _dim(x, dim)
        wide = x.astype(accumulator(result))
        return (wide if axis is None else fn(wide, axis=axis)).astype(result)

    return along


lower(aten.cumsum.default, pad=SCAN)(_scan(jnp.cumsum))
lower(aten.cumprod.default, pad=SCAN)(_scan(jnp.cumprod))


@lower(aten.logcumsumexp.default, aten._logcumsumexp.default)
def logcumsumexp(x, dim):
    if _is_integral(x.dtype):
        raise NotImplementedError(f"logcumsumexp not implemented for '{type_name(x.dtype)}'")
    axis = _dim(x, dim)
    if axis is None or x.shape[axis] == 0:
        return x
    wide = x.astype(accumulator(x.dtype))
    if jnp.iscomplexobj(x):
        return _complex_logcumsumexp(wide, axis).astype(x.dtype)
    return lax.cumlogsumexp(wide, axis=axis).astype(x.dtype)


def _complex_log_add_exp(total, x):
    """CPU's complex logcumsumexp step ``log(exp(total) + exp(x))``: shifted by the operand with
    the larger real part (``x`` on ties), whose imaginary part it keeps, not wrapped to
    (-pi, pi], so the result depends on the order of the steps."""
    x_lower = jnp.real(x) < jnp.real(total)
    low, high = jnp.where(x_lower, x, total), jnp.where(x_lower, total, x)
    shifted = jnp.log1p(jnp.exp(low - high)) + high
    # equal infinite real parts: -inf keeps ``low``; +inf must not compute inf - inf
    infinite = jnp.where(jnp.real(low) < 0, low, jnp.log(jnp.exp(low) + jnp.exp(high)))
    both_infinite = jnp.isinf(jnp.real(low)) & (jnp.real(low) == jnp.real(high))
    nan = lax.complex(jnp.nan, jnp.nan).astype(x.dtype)
    return jnp.where(jnp.isnan(x) | jnp.isnan(total), nan, jnp.where(both_infinite, infinite, shifted))


def _complex_logcumsumexp(x, axis: int):
    """The CPU kernel's sequential scan (its branch choices make the step non-associative)."""

    def step(total, element):
        total = _complex_log_add_exp(total, element)
        return total, total

    start = jnp.full(x.shape[:axis] + x.shape[axis + 1 :], -jnp.inf, x.dtype)
    _, out = lax.scan(step, start, jnp.moveaxis(x, axis, 0))
    return jnp.moveaxis(out, 0, axis)


def _running_extreme(later_wins):
    """``cummax``/``cummin``: the CPU kernel's running (value, index) pair. A later element
    replaces the current one when it ties or beats it, or is NaN; once NaN, it stays. That
    rule is associative, so it runs as a parallel scan."""

    def combine(a, b):
        (va, ia), (vb, ib) = a, b
        take_b = ~_isnan(va) & (_isnan(vb) | later_wins(vb, va))
        return jnp.where(take_b, vb, va), jnp.where(take_b, ib, ia)

    def along(x, dim):
        axis = _dim(x, dim)
        if axis is None:
            return x, jnp.zeros((), INDEX)
        if x.shape[axis] == 0:
            return x, jnp.zeros(x.shape, INDEX)
        index = lax.broadcasted_iota(INDEX, x.shape, axis)
        return lax.associative_scan(combine, (x, index), axis=axis)

    return along


def _isnan(x):
    return jnp.isnan(x) if jnp.issubdtype(x.dtype, jnp.inexact) else jnp.zeros(x.shape, bool)


lower(aten.cummax.default)(_running_extreme(jnp.greater_equal))
lower(aten.cummin.default)(_running_extreme(jnp.less_equal))


# ----------------------------------------------------------------------------- sort and selection
def _sort(x, axis: int, descending: bool = False):
    """Stable sort along ``axis``: values and int64 source indices. NaN sorts as the largest
    value and -0.0 ties with 0.0, as in torch. A descending stable sort is the reverse of an
    ascending stable sort of the reversed input (which keeps ties in source order)."""
    index = lax.broadcasted_iota(INDEX, x.shape, axis)
    if descending:
        x, index = jnp.flip(x, axis), jnp.flip(index, axis)
    values, index = lax.sort((x, index), dimension=axis, num_keys=1, is_stable=True)
    if descending:
        values, index = jnp.flip(values, axis), jnp.flip(index, axis)
    return values, index


@lower(aten.sort.stable)
def sort_stable(x, stable=None, dim=-1, descending=False):
    axis = _dim(x, dim)
    if axis is None:
        return x, jnp.zeros((), INDEX)
    return _sort(x, axis, descending)


@lower(aten.sort.default)
def sort(x, dim=-1, descending=False):
    return sort_stable(x, True, dim, descending)


def _take(values, index, axis, position, keepdim):
    """Element ``position`` (static int or per-slice array) along ``axis`` of sorted outputs."""
    position = (
        jnp.expand_dims(jnp.asarray(position, INDEX), axis)
        if jnp.ndim(position)
        else jnp.full(values.shape[:axis] + (1,) + values.shape[axis + 1 :], position, INDEX)
    )
    picked = [jnp.take_along_axis(a, position, axis) for a in (values, index)]
    return tuple(p if keepdim else jnp.squeeze(p, axis) for p in picked)


def _selection(name, x, dim):
    """Axis of an order-statistic op (None for 0-dim inputs), checking it is not empty."""
    axis = _dim(x, dim)
    if axis is not None:
        _nonempty(x, (axis,), name)
    return axis


@lower(aten.topk.default)
def topk(x, k, dim=-1, largest=True, sorted=True):
    if x.dtype == jnp.bool_:
        raise RuntimeError("topk does not support bool dtypes")
    axis = _dim(x, dim)
    size = 1 if axis is None else x.shape[axis]
    if not 0 <= k <= size:
        raise RuntimeError("selected index k out of range")
    if axis is None:
        return x, jnp.zeros((), INDEX)
    values, index = _sort(x, axis, descending=largest)
    return lax.slice_in_dim(values, 0, k, axis=axis), lax.slice_in_dim(index, 0, k, axis=axis)


@lower(aten.kthvalue.default)
def kthvalue(x, k, dim=-1, keepdim=False):
    axis = _selection("kthvalue", x, dim)
    size = 1 if axis is None else x.shape[axis]
    if not 1 <= k <= size:
        raise RuntimeError(
            f"kthvalue(): selected number k out of range for dimension {0 if axis is None else axis}"
        )
    if axis is None:
        return x, jnp.zeros((), INDEX)
    return _take(*_sort(x, axis), axis, k - 1, keepdim)


def _median_position(sorted_values, axis, ignore_nan):
    """Position of the lower median in each sorted slice. NaNs sort last: ``median`` returns
    the first NaN of a slice that has one; ``nanmedian`` takes the median of the rest."""
    size = sorted_values.shape[axis]
    nans = jnp.sum(_isnan(sorted_values), axis=axis, dtype=INDEX)
    if ignore_nan:
        return (jnp.maximum(size - nans, 1) - 1) // 2
    return jnp.where(nans > 0, size - nans, (size - 1) // 2)


def _median(name, ignore_nan):
    def along(x, dim, keepdim=False):
        axis = _selection(name, x, dim)
        if axis is None:
            return x, jnp.zeros((), INDEX)
        values, index = _sort(x, axis)
        return _take(values, index, axis, _median_position(values, axis, ignore_nan), keepdim)

    def full(x):
        if x.size == 0:
            return jnp.full((), jnp.nan, x.dtype)
        return along(x.reshape(-1), 0)[0]

    return full, along


for _name, _ignore_nan in [("median", False), ("nanmedian", True)]:
    _full, _along = _median(_name, _ignore_nan)
    lower(getattr(aten, _name).default)(_full)
    lower(getattr(aten, _name).dim)(_along)


@lower(aten.mode.default)
def mode(x, dim=-1, keepdim=False):
    """The most frequent value (the smallest among equally frequent ones) and the index of its
    last occurrence, as the CPU kernel returns."""
    axis = _selection("mode", x, dim)
    if axis is None:
        return x, jnp.zeros((), INDEX)
    values = jnp.sort(x, axis=axis)
    size = x.shape[axis]
    position = lax.broadcasted_iota(INDEX, x.shape, axis)
    previous = jnp.concatenate(
        [lax.slice_in_dim(values, 0, 1, axis=axis), lax.slice_in_dim(values, 0, size - 1, axis=axis)], axis
    )
    run_start = jnp.where((position == 0) | (values != previous), position, 0)
    run_start = lax.cummax(run_start, axis=axis)
    run_length = position - run_start + 1
    # the last element of the longest (first, hence smallest) run
    best_end = jnp.argmax(run_length, axis=axis, keepdims=True)
    value = jnp.take_along_axis(values, best_end, axis)
    last_index = jnp.max(
        jnp.where(x == value, lax.broadcasted_iota(INDEX, x.shape, axis), -1), axis=axis, keepdims=True
    )
    return tuple(a if keepdim else jnp.squeeze(a, axis) for a in (value, last_index))


@runtime(aten.equal.default)
def equal(self, other) -> bool:
    """Same size and equal values (after type promotion, as on CPU); reading the answer back
    is a host sync, as on CUDA."""
    if self.shape != other.shape:
        return False
    return bool(aten.all.default(aten.eq.Tensor(self, other)).item())


# ----------------------------------------------------------------------------- segment_reduce
# Segments along ``axis`` given by ``lengths`` (or ``offsets``, one more per row) whose leading
# dimensions are data's before ``axis``: data is viewed as (rows, positions, inner) and each
# position gets its segment's id, past the last segment an id that is dropped.
_SEGMENT_START = {"max": -jnp.inf, "min": jnp.inf, "sum": 0, "mean": 0, "prod": 1}


def _segments(data, lengths, offsets, axis):
    """(data as (rows, positions, inner), segment id per (row, position), lengths (rows, S))."""
    if offsets is not None:
        lengths = jnp.diff(offsets, axis=-1)
    rows, count = math.prod(lengths.shape[:-1]), lengths.shape[-1]
    lengths = lengths.reshape(rows, count).astype(jnp.int64)
    values = data.reshape(rows, data.shape[axis], -1)
    ends = jnp.cumsum(lengths, axis=-1)
    ids = jnp.sum(ends[:, None, :] <= jnp.arange(values.shape[1])[None, :, None], axis=-1)
    return values, ids, lengths


@jax.jit
def _lengths_errors(lengths, total):
    return jnp.any(lengths < 0), jnp.any(lengths.sum(-1) != total)


def _report_lengths(errors) -> None:
    negative, wrong_sum = errors
    if negative:
        raise RuntimeError("lengths contains negative value!")
    if wrong_sum:
        raise RuntimeError(
            "segment_reduce(): Expected all rows of lengths along axis to sum to "
            "data.size(lengths.dim()-1) when !unsafe."
        )


def _check_segment_reduce(
    data, reduce, lengths=None, indices=None, offsets=None, axis=0, unsafe=False, initial=None
):
    """CPU's value checks of ``lengths`` (offsets are not checked), unless ``unsafe``."""
    if lengths is not None and not unsafe and lengths.size and has_values(lengths):
        report_values(apply(_lengths_errors, lengths, data.shape[axis % data.ndim]), _report_lengths)


@lower(aten.segment_reduce.default, check=_check_segment_reduce)
def segment_reduce(
    data, reduce, lengths=None, indices=None, offsets=None, axis=0, unsafe=False, initial=None
):
    require(reduce in _SEGMENT_START and indices is None and (lengths is not None or offsets is not None))
    axis = axis % data.ndim
    values, ids, lengths = _segments(data, lengths, offsets, axis)
    rows, count = lengths.shape
    compute = accumulator(data.dtype) if jnp.issubdtype(data.dtype, jnp.floating) else data.dtype
    start = _SEGMENT_START[reduce] if initial is None else initial
    out = jnp.full((rows, count + 1, values.shape[2]), start, compute)
    index = (jnp.arange(rows)[:, None], ids)
    values = values.astype(compute)
    scatter = out.at[index]
    if reduce in ("sum", "mean"):
        out = scatter.add(values)
    elif reduce == "prod":
        out = scatter.multiply(values)
    else:  # a NaN wins, as in CPU's loop
        nan = jnp.zeros_like(out, bool).at[index].max(jnp.isnan(values))
        out = jnp.where(nan, jnp.nan, getattr(scatter, reduce)(values))
    out = out[:, :count]
    if reduce == "mean":
        n = lengths[..., None].astype(compute)
        empty = jnp.nan if initial is None else initial
        out = jnp.where(n > 0, out / jnp.maximum(n, 1), empty)
    return out.astype(data.dtype).reshape(data.shape[:axis] + (count,) + data.shape[axis + 1 :])


def _segmented_scan(values, starts, reverse=False):
    """Inclusive products within each segment along axis 1 (``starts`` marks where one begins)."""

    def combine(a, b):
        return jnp.where(b[1], b[0], a[0] * b[0]), a[1] | b[1]

    return lax.associative_scan(combine, (values, starts), reverse=reverse, axis=1)[0]


def _exclusive_products(values, ids):
    """Each element's segment's product without it, from products before and after it."""
    first = jnp.concatenate([jnp.ones_like(ids[:, :1], bool), ids[:, 1:] != ids[:, :-1]], 1)[..., None]
    last = jnp.concatenate([ids[:, 1:] != ids[:, :-1], jnp.ones_like(ids[:, :1], bool)], 1)[..., None]
    before = _segmented_scan(values, jnp.broadcast_to(first, values.shape))
    after = _segmented_scan(values, jnp.broadcast_to(last, values.shape), reverse=True)
    ones = jnp.ones_like(values[:, :1])
    before = jnp.where(first, 1, jnp.concatenate([ones, before[:, :-1]], 1))
    after = jnp.where(last, 1, jnp.concatenate([after[:, 1:], ones], 1))
    return before * after


@lower(aten._segment_reduce_backward.default)
def segment_reduce_backward(grad, output, data, reduce, lengths=None, offsets=None, axis=0, initial=None):
    """CPU's gradients: max/min share a segment's gradient among the elements equal to its
    result (dividing only positive shares, as CPU's loop does); prod divides the product by
    each element, or multiplies the others for a zero or NaN element."""
    axis = axis % data.ndim
    values, ids, lengths = _segments(data, lengths, offsets, axis)
    rows, count = lengths.shape
    compute = accumulator(data.dtype)
    values = values.astype(compute)
    padded = jnp.concatenate([a.astype(compute).reshape(rows, count, -1) for a in (grad, output)], 2)
    padded = jnp.pad(padded, ((0, 0), (0, 1), (0, 0)))  # the dropped id reads zeros
    picked = jnp.take_along_axis(padded, ids[..., None], axis=1)
    g, out = jnp.split(picked, 2, axis=2)
    n = jnp.take_along_axis(jnp.pad(lengths, ((0, 0), (0, 1))), ids, axis=1)[..., None].astype(compute)
    if reduce == "sum":
        result = g
    elif reduce == "mean":
        result = g / jnp.maximum(n, 1)
    elif reduce == "prod":
        others = _exclusive_products(values, ids) * (1 if initial is None else initial)
        special = jnp.isnan(values) | (values == 0)
        result = jnp.where(special, g * others, g * out / jnp.where(special, 1, values))
    else:
        hit = jnp.isnan(values) | (values == out)
        share = jnp.where(hit, g, 0)
        ties = (
            jnp.zeros((rows, count + 1, values.shape[2]), compute).at[jnp.arange(rows)[:, None], ids].add(hit)
        )
        ties = jnp.take_along_axis(ties, ids[..., None], axis=1)
        result = jnp.where((ties >= 2) & (share > 0), share / ties, share)
    result = jnp.where(ids[..., None] < count, result, 0)
    return result.astype(data.dtype).reshape(data.shape)


# the deprecated spellings of aminmax (all elements; one dim) that older models still call
lower(aten._aminmax.default, aten._aminmax.dim)(aminmax)
