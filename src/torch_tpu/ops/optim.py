"""Optimizer lowerings: the ``_foreach_*`` list ops, the fused optimizers (Adam, AdamW, SGD,
Adagrad) and AMP's gradient unscaling and loss-scale update.

Each op is ONE jitted function over its whole tensor list, so an optimizer step costs one
dispatch per phase instead of one per parameter. A foreach op is its single-tensor lowering
applied tensor by tensor, with PyTorch's type promotion per tensor (one list can mix dtypes, e.g.
float parameters and int64 step counters), as CPU's foreach kernels do.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import jax.numpy as jnp
import numpy as np
import torch

from ..runtime.dtypes import cast, check_scalar
from ._helpers import accumulator, host_number, to_torch, type_name
from .dispatch import fitted_dtype, promoted
from .elementwise import lerp
from .registry import LOWERINGS, Types, lower

aten = torch.ops.aten

# ----------------------------------------------------------------------------- foreach family
_PYTHON_SCALAR = {"b": bool, "i": int, "u": int, "f": float, "c": complex}


def _is_tensor(arg: torch._C.Argument) -> bool:
    return str(arg.type) in ("Tensor", "Optional[Tensor]")


def _is_number(arg: torch._C.Argument) -> bool:
    return str(arg.type) in ("number", "Optional[number]")


def _promotion_signature(value, is_tensor: bool) -> tuple:
    """What ``torch.result_type`` sees: (dtype, is 0-dim) for a tensor, the Python type of a
    Scalar (which reaches a lowering as a weakly typed device scalar, or a Python number)."""
    if is_tensor and hasattr(value, "dtype"):
        return to_torch(value.dtype), value.ndim == 0
    if isinstance(value, (bool, int, float, complex)):
        return type(value), True
    return _PYTHON_SCALAR[np.dtype(value.dtype).kind], True


def _typing(op: torch._ops.OpOverload) -> Callable[[Sequence], Types] | None:
    """``op``'s promoted dtypes as a function of one tensor's arguments (schema order), as the
    dispatcher computes them for a single call; None for an op that promotes nothing."""
    entry = LOWERINGS[op]
    if entry.promote is None:
        return None
    arguments = op._schema.arguments
    names = entry.promote_args or [a.name for a in arguments if _is_tensor(a) or _is_number(a)]
    taking_part = [(i, _is_tensor(a)) for i, a in enumerate(arguments) if a.name in names]

    def types_of(values: Sequence) -> Types:
        signature = tuple(
            _promotion_signature(values[i], is_tensor)
            for i, is_tensor in taking_part
            if i < len(values) and values[i] is not None
        )
        return promoted(entry.promote, signature, torch.get_default_dtype())

    return types_of


def _per_tensor(op: torch._ops.OpOverload) -> Callable:
    """``op``'s lowering as a function of one tensor's arguments (schema order), computing its
    promoted dtypes from those arguments (:func:`_typing`)."""
    entry, types_of = LOWERINGS[op], _typing(op)
    if types_of is None:
        return entry.fn
    return lambda *values: entry.fn(*values, types=types_of(values))


#: numbers every dtype holds (an optimizer's rates, betas and epsilons): no further check
_HELD_BY_ALL = 127


def _may_overflow(number: bool | int | float | complex | None) -> bool:
    """Whether some dtype may not hold ``number`` (None: a traced one, not checked)."""
    return number is not None and (type(number) is complex or not -_HELD_BY_ALL <= number <= _HELD_BY_ALL)


def _fitted_numbers(op: torch._ops.OpOverload, single: torch._ops.OpOverload) -> Callable | None:
    """CPU converts a foreach op's Scalar, or each number of its ScalarList, as ``single``
    converts the argument in its place (``Lowering.fitted``): into each tensor's result dtype,
    refusing a number that dtype cannot hold. The check of ``op``'s converted arguments, or
    None where ``single`` fits none of them."""
    entry, types_of = LOWERINGS[single], _typing(single)
    fitted = (*entry.fitted, *entry.fitted_in_opmath)
    positions = [
        (i, theirs.name in entry.fitted_in_opmath)
        for i, (ours, theirs) in enumerate(zip(op._schema.arguments, single._schema.arguments))
        if theirs.name in fitted and str(ours.type) in ("number", "List[number]")
    ]
    if not positions or types_of is None:
        return None

    def check(values: Sequence) -> None:
        for i, in_opmath in positions:
            given = values[i]
            each = isinstance(given, list)  # (a ScalarList: a number per tensor)
            if not each and not _may_overflow(host_number(given)):
                continue  # (one number for all, which every dtype holds: the common case)
            count = len(next(v for v in values if isinstance(v, list)))
            for t in range(count):
                number = host_number(given[t] if each else given)
                if _may_overflow(number):
                    one = [v[t] if isinstance(v, list) else v for v in values]
                    check_scalar(number, fitted_dtype(types_of(one).result, in_opmath), 2)

    return check


def _list_checks(
    op: torch._ops.OpOverload, rows: Sequence[int] = (), numbers: Callable | None = None
) -> Callable:
    """CPU's argument checks for a foreach op: list lengths, the 0-dim ``Tensor`` scalar (one
    value for all) or the ``rows`` tensors (one value per tensor) of Tensor overloads, then
    ``numbers`` (:func:`_fitted_numbers`)."""
    kinds = [str(a.type) for a in op._schema.arguments]
    tensor_lists = [i for i, k in enumerate(kinds) if k == "List[Tensor]"]
    scalar_lists = [i for i, k in enumerate(kinds) if k == "List[number]"]
    scalar_tensors = [i for i, k in enumerate(kinds) if k == "Tensor"]

    def check(*values):
        count = len(values[tensor_lists[0]])
        if not count:
            raise RuntimeError("Tensor list must have at least one tensor.")
        for i in tensor_lists[1:]:
            if len(values[i]) != count:
                raise RuntimeError(
                    f"Tensor lists must have the same number of tensors, got {count} and {len(values[i])}"
                )
        for i in scalar_lists:
            if len(values[i]) != count:
                raise RuntimeError("Tensor list must have same number of elements as scalar list.")
        for i in rows:  # read on the host by the dispatcher: one number per tensor
            if len(values[i]) != count:
                raise RuntimeError(
                    f"Expected length of scalars to match input of length {count} but got "
                    f"{len(values[i])} instead."
                )
        for i in scalar_tensors:
            scalar = values[i]
            if i in rows or not hasattr(scalar, "ndim"):
                continue  # (a CPU scalar tensor is already a number)
            if scalar.ndim != 0:
                raise RuntimeError(
                    f"scalar tensor expected to be 0 dim but it has {scalar.ndim} "
                    f"dimensions and {scalar.size} elements."
                )
        if numbers is not None:
            numbers(values)

    return check


def foreach(
    op: torch._ops.OpOverload, single: torch._ops.OpOverload, per_tensor_rows: Sequence[str] = ()
) -> None:
    """Lower foreach ``op`` as ``single``'s lowering applied to each tensor of its lists.

    List arguments (``Tensor[]``, ``Scalar[]``) give one element per tensor, other arguments are
    shared; ``per_tensor_rows`` names tensor arguments holding one value per tensor (the
    ``scalars`` of ``_foreach_addcmul.Tensor``). A Scalar ``single`` needs as a compile-time
    constant is static here too.
    """
    names = [a.name for a in op._schema.arguments]
    single_names = [a.name for a in single._schema.arguments]
    static = tuple(
        name
        for name, single_name, arg in zip(names, single_names, op._schema.arguments)
        if _is_number(arg) and single_name in LOWERINGS[single].static
    )
    rows = [names.index(n) for n in per_tensor_rows]
    apply = _per_tensor(single)

    def lowering(*args):
        args = [list(a) if i in rows else a for i, a in enumerate(args)]
        count = len(next(a for a in args if isinstance(a, list)))
        return [apply(*(a[i] if isinstance(a, list) else a for a in args)) for i in range(count)]

    lowering.__name__ = op.__name__.replace(".", "_")
    check = _list_checks(op, rows, _fitted_numbers(op, single))
    lower(op, static=static, check=check, check_lists_by_length=True)(lowering)


_UNARY = (
    "abs",
    "acos",
    "asin",
    "atan",
    "ceil",
    "cos",
    "cosh",
    "erf",
    "erfc",
    "exp",
    "expm1",
    "floor",
    "frac",
    "lgamma",
    "log",
    "log10",
    "log1p",
    "log2",
    "neg",
    "reciprocal",
    "round",
    "rsqrt",
    "sigmoid",
    "sign",
    "sin",
    "sinh",
    "sqrt",
    "tan",
    "tanh",
    "trunc",
)
for _name in _UNARY:
    foreach(getattr(aten, f"_foreach_{_name}").default, getattr(aten, _name).default)

foreach(aten._foreach_max.default, aten.max.default)
foreach(aten._foreach_mm.default, aten.mm.default)

# (foreach name, single op for Tensor[]/Tensor operands, single op for Scalar/Scalar[] operands);
# CPU computes foreach maximum/minimum with a scalar as clamp_min/clamp_max
_BINARY = [
    ("add", aten.add.Tensor, aten.add.Scalar),
    ("sub", aten.sub.Tensor, aten.sub.Scalar),
    ("mul", aten.mul.Tensor, aten.mul.Scalar),
    ("div", aten.div.Tensor, aten.div.Scalar),
    ("clamp_min", aten.clamp_min.Tensor, aten.clamp_min.default),
    ("clamp_max", aten.clamp_max.Tensor, aten.clamp_max.default),
    ("maximum", aten.maximum.default, aten.clamp_min.default),
    ("minimum", aten.minimum.default, aten.clamp_max.default),
    ("pow", aten.pow.Tensor_Tensor, aten.pow.Tensor_Scalar),
    ("lerp", aten.lerp.Tensor, aten.lerp.Scalar),
]
for _name, _tensor_op, _scalar_op in _BINARY:
    _packet = getattr(aten, f"_foreach_{_name}")
    for _overload in ("List", "Tensor", "Scalar", "ScalarList"):
        if _overload in _packet.overloads():
            foreach(
                getattr(_packet, _overload), _tensor_op if _overload in ("List", "Tensor") else _scalar_op
            )
foreach(aten._foreach_pow.ScalarAndTensor, aten.pow.Scalar)

for _packet, _single in [
    (aten._foreach_addcmul, aten.addcmul.default),
    (aten._foreach_addcdiv, aten.addcdiv.default),
]:
    foreach(_packet.Scalar, _single)
    foreach(_packet.ScalarList, _single)
    foreach(_packet.Tensor, _single, per_tensor_rows=("scalars",))


@lower(aten._foreach_zero.default)
def foreach_zero(xs):
    return [jnp.zeros_like(x) for x in xs]


@lower(aten._foreach_clone.default)
def foreach_clone(xs, memory_format=None):
    return list(xs)  # arrays are immutable: the new tensors may share them


def _copied(value, like):
    """``like.copy_(value)``'s result: ``value`` broadcast to ``like``'s shape, converted to its
    dtype as ``copy_`` converts."""
    return jnp.broadcast_to(cast(value, like.dtype), like.shape)


@lower(aten._foreach_copy.default, check=_list_checks(aten._foreach_copy.default), check_lists_by_length=True)
def foreach_copy(xs, sources, non_blocking=False):
    return [_copied(s, x) for x, s in zip(xs, sources)]


@lower(aten._foreach_powsum.Scalar, static=("ord",))
def foreach_powsum(xs, ord=2, dtype=None):
    """``sum(|x| ** ord)`` per tensor (a norm before its root), accumulated as CPU does."""
    sums = []
    for x in xs:
        if not jnp.issubdtype(x.dtype, jnp.inexact):
            raise NotImplementedError(f"\"powsum_cpu\" not implemented for '{type_name(x.dtype)}'")
        magnitude = jnp.abs(x)
        result = magnitude.dtype if dtype is None else dtype
        wide = accumulator(result)
        sums.append(jnp.sum(magnitude.astype(wide) ** jnp.asarray(ord, wide)).astype(result))
    return sums


# ----------------------------------------------------------------------------- fused optimizers
# Hyperparameters arrive as device scalars: a scheduler changing lr every step never recompiles.
_HYPERPARAMETERS = ("lr", "beta1", "beta2", "weight_decay", "eps", "lr_decay", "momentum", "dampening")


class _Step:
    """One tensor's view of a fused CPU kernel: math in the parameter's opmath dtype, each
    hyperparameter (a double on CPU) rounded once to that dtype."""

    def __init__(self, param, grad, grad_scale, maximize: bool):
        self.dtype = param.dtype
        self.opmath = accumulator(param.dtype)
        self.param = param.astype(self.opmath)
        grad = grad.astype(self.opmath)
        if grad_scale is not None:
            grad = grad / grad_scale.astype(self.opmath)
        self.unscaled_grad = grad.astype(self.dtype)  # CPU writes the unscaled gradient back
        self.grad = -grad if maximize else grad

    def coefficient(self, value):
        return jnp.asarray(value, self.opmath)

    def state(self, value):
        return value.astype(self.opmath)

    def decayed_grad(self, weight_decay):
        """``grad + weight_decay * param``, skipped (not multiplied by 0) without decay."""
        decayed = self.grad + self.param * self.coefficient(weight_decay)
        return jnp.where(weight_decay != 0, decayed, self.grad)


def _unless_inf(found_inf, new: list, old: list) -> list:
    """CPU's fused kernels return before touching anything when ``found_inf`` is 1."""
    if found_inf is None:
        return [n.astype(o.dtype) for n, o in zip(new, old)]
    skip = found_inf == 1.0
    return [jnp.where(skip, o, n.astype(o.dtype)) for n, o in zip(new, old)]


def _fused_adam(decoupled_weight_decay: bool) -> Callable:
    """``_fused_adam`` (weight decay added to the gradient) or ``_fused_adamw`` (decoupled)."""

    def fused_adam(
        params,
        grads,
        exp_avgs,
        exp_avg_sqs,
        max_exp_avg_sqs,
        state_steps,
        lr,
        beta1,
        beta2,
        weight_decay,
        eps,
        amsgrad,
        maximize,
        grad_scale=None,
        found_inf=None,
    ):
        lr = jnp.asarray(lr, jnp.float64)  # tensor_lr: CPU reads lr as a double too
        outputs = ([], [], [], [], [])
        for i, (param, grad, exp_avg, exp_avg_sq, step) in enumerate(
            zip(params, grads, exp_avgs, exp_avg_sqs, state_steps)
        ):
            t = _Step(param, grad, grad_scale, maximize)
            step = step.astype(jnp.float64)
            step_size = lr / (1 - beta1**step)
            bias_correction2_sqrt = jnp.sqrt(1 - beta2**step)
            new_param, grad_term = t.param, t.grad
            if decoupled_weight_decay:
                new_param = jnp.where(
                    weight_decay != 0, t.param * t.coefficient(1 - lr * weight_decay), t.param
                )
            else:
                grad_term = t.decayed_grad(weight_decay)
            opmath_types = Types(t.opmath, t.opmath)
            new_exp_avg = lerp(t.state(exp_avg), grad_term, t.coefficient(1 - beta1), types=opmath_types)
            new_exp_avg_sq = (
                t.state(exp_avg_sq) * t.coefficient(beta2) + t.coefficient(1 - beta2) * grad_term * grad_term
            )
            second_moment, new_state = new_exp_avg_sq, []
            if amsgrad:
                second_moment = jnp.maximum(t.state(max_exp_avg_sqs[i]), new_exp_avg_sq)
                new_state = [second_moment]
            denom = jnp.sqrt(second_moment) / t.coefficient(bias_correction2_sqrt) + t.coefficient(eps)
            new_param = new_param + t.coefficient(-step_size) * new_exp_avg / denom
            old = [param, grad, exp_avg, exp_avg_sq] + ([max_exp_avg_sqs[i]] if amsgrad else [])
            new = [new_param, t.unscaled_grad, new_exp_avg, new_exp_avg_sq] + new_state
            for output, value in zip(outputs, _unless_inf(found_inf, new, old)):
                output.append(value)
        return outputs

    return fused_adam


lower(aten._fused_adam.default, aten._fused_adam.tensor_lr, dynamic=_HYPERPARAMETERS)(
    _fused_adam(decoupled_weight_decay=False)
)
lower(aten._fused_adamw.default, aten._fused_adamw.tensor_lr, dynamic=_HYPERPARAMETERS)(
    _fused_adam(decoupled_weight_decay=True)
)


@lower(aten._fused_sgd.default, aten._fused_sgd.tensor_lr, dynamic=_HYPERPARAMETERS)
def fused_sgd(
    params,
    grads,
    momentum_buffer_list,
    weight_decay,
    momentum,
    lr,
    dampening,
    nesterov,
    maximize,
    is_first_step,
    grad_scale=None,
    found_inf=None,
):
    """The optimizer passes no momentum buffers when momentum is 0 (plain SGD)."""
    outputs = ([], [], [])
    buffers = momentum_buffer_list or [None] * len(params)
    for param, grad, buffer in zip(params, grads, buffers):
        t = _Step(param, grad, grad_scale, maximize)
        update = t.decayed_grad(weight_decay)
        old, new = [param, grad], []
        if buffer is not None:
            new_buffer = (
                update
                if is_first_step
                else (t.state(buffer) * t.coefficient(momentum) + update * t.coefficient(1 - dampening))
            )
            update = update + new_buffer * t.coefficient(momentum) if nesterov else new_buffer
            old, new = old + [buffer], [new_buffer]
        new_param = t.param - update * t.coefficient(jnp.asarray(lr, jnp.float64))
        for output, value in zip(outputs, _unless_inf(found_inf, [new_param, t.unscaled_grad] + new, old)):
            output.append(value)
    return outputs


def _adagrad(
    params,
    grads,
    state_sums,
    state_steps,
    lr,
    lr_decay,
    weight_decay,
    eps,
    maximize,
    grad_scale=None,
    found_inf=None,
) -> tuple[list, list, list]:
    lr = jnp.asarray(lr, jnp.float64)
    outputs = ([], [], [])
    for param, grad, state_sum, step in zip(params, grads, state_sums, state_steps):
        t = _Step(param, grad, grad_scale, maximize)
        clr = lr / (1 + (step.astype(jnp.float64) - 1) * lr_decay)
        update = t.decayed_grad(weight_decay)
        new_sum = t.state(state_sum) + update * update
        std = jnp.sqrt(new_sum) + t.coefficient(eps)
        new_param = t.param - t.coefficient(clr) * update / std
        for output, value in zip(
            outputs, _unless_inf(found_inf, [new_param, t.unscaled_grad, new_sum], [param, grad, state_sum])
        ):
            output.append(value)
    return outputs


@lower(aten._fused_adagrad.default, dynamic=_HYPERPARAMETERS)
def fused_adagrad(params, grads, state_sums, state_steps, *hyperparameters, **options):
    """This overload also returns the (unchanged) step counters: its in-place form marks them
    written."""
    return (*_adagrad(params, grads, state_sums, state_steps, *hyperparameters, **options), list(state_steps))


lower(aten._fused_adagrad.tensor_lr, dynamic=_HYPERPARAMETERS)(_adagrad)


# ----------------------------------------------------------------------------- AMP
@lower(aten._amp_foreach_non_finite_check_and_unscale.default)
def amp_foreach_non_finite_check_and_unscale(grads, found_inf, inv_scale):
    """Multiply every gradient by ``inv_scale`` (in opmath); ``found_inf`` becomes 1 if any
    value is inf or NaN, and keeps its value otherwise."""
    unscaled = [
        (g.astype(accumulator(g.dtype)) * inv_scale.astype(accumulator(g.dtype))).astype(g.dtype)
        for g in grads
    ]
    if not grads:
        return unscaled, found_inf
    non_finite = jnp.stack([~jnp.all(jnp.isfinite(g)) for g in grads]).any()
    return unscaled, jnp.where(non_finite, jnp.ones_like(found_inf), found_inf)


@lower(aten._amp_update_scale.default)
def amp_update_scale(
    scale,
    growth_tracker,
    found_inf,
    scale_growth_factor: float,
    scale_backoff_factor: float,
    growth_interval: int,
):
    """Back off on inf/NaN gradients; grow after ``growth_interval`` clean steps in a row
    (unless growing overflows float32). CPU multiplies by the double factors, then rounds."""
    wide = scale.astype(jnp.float64)
    successful = growth_tracker + 1
    grows = successful == growth_interval
    grown = (wide * scale_growth_factor).astype(scale.dtype)
    clean_scale = jnp.where(grows & jnp.isfinite(grown), grown, scale)
    found = found_inf != 0
    new_scale = jnp.where(found, (wide * scale_backoff_factor).astype(scale.dtype), clean_scale)
    new_tracker = jnp.where(found | grows, jnp.zeros_like(growth_tracker), successful)
    return new_scale, new_tracker.astype(growth_tracker.dtype)
