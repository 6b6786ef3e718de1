"""``TORCH_TPU_CHECK_META=1``: every tpu kernel call checked against PyTorch's Meta kernel.

A test tool (it costs a meta replay per op; the suite runs under it to find lowerings whose
outputs or errors differ from PyTorch's). While ``flags.check_meta`` is on, each call of a tpu
kernel (functional lowerings, their derived in-place and ``out=`` variants, runtime kernels) is
first replayed on meta tensors of the same shapes, strides and dtypes (factories on
``device="meta"``). Then:

- PyTorch rejects the arguments (the meta kernel raises): the tpu kernel must raise the same
  exception type. Accepting them is a silent wrong answer (``mm`` of a 5x1 by a 2x3 matrix once
  returned a 5x3 tensor of 2s): :class:`MetaMismatch` says so, with PyTorch's error chained.
- PyTorch accepts them: every tensor the tpu kernel returns, and every tensor it writes (in-place
  targets, ``out=``), must have the meta result's shape, dtype and strides, else
  :class:`MetaMismatch`. Only the strides of dimensions longer than 1 are compared: the others
  never address memory. The tpu kernel may still raise: value checks (an index out of range, a
  singular matrix) and dtypes tpu lacks are beyond meta tensors.

Ops in :data:`UNCHECKED` are not replayed (no meta kernel, or one known to differ, each with why).
Ops laid out by CPU's channels-last rule (``Layout.SUGGESTED``, ``Layout.CONVOLUTION``: their meta
kernels return contiguous results CPU does not) have their output strides left unchecked.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
from torch.utils import _pytree

from ..runtime.flags import flags
from .meta import NEEDS_VALUES_MESSAGES, call_quietly, to_meta
from .registry import LOWERINGS, Layout, qualified_name

__all__ = ["CPU_ERROR_TYPES", "META_STRICTER", "MetaMismatch", "UNCHECKED", "UNCHECKED_OUTPUTS", "checked"]

#: Ops (packet ``aten::x``, or one overload ``aten::x.overload``) whose calls are not replayed on
#: meta, each with the reason. A lowering of an op with no meta kernel belongs here: the checker
#: reports its calls (as arguments PyTorch rejects) until it is listed.
UNCHECKED: dict[str, str] = {
    # output shape depends on the values: PyTorch has no meta kernel (or one that raises)
    **dict.fromkeys(
        [
            "aten::nonzero",
            "aten::masked_select",
            "aten::_unique",
            "aten::_unique2",
            "aten::unique_dim",
            "aten::unique_consecutive",
            "aten::unique_dim_consecutive",
            "aten::bincount",
            "aten::_ctc_loss.Tensor",
        ],
        "output shape depends on values",
    ),
    # return values, which meta tensors do not have
    "aten::_local_scalar_dense": "returns a tensor's value",
    "aten::equal": "returns whether values are equal",
    # their arguments are storages, which have no meta stand-in
    "aten::set_.source_Storage": "takes a storage",
    "aten::set_.source_Storage_storage_offset": "takes a storage",
    # no meta kernel in PyTorch (nor a fake one)
    **dict.fromkeys(
        [
            "aten::glu_jvp",
            "aten::glu_backward_jvp",
            "aten::_add_relu.Scalar",
            "aten::_add_relu.out",
            "aten::_logcumsumexp",
            "aten::_compute_linear_combination",
            "aten::geqrf",
            "aten::multi_margin_loss_backward",
            "aten::multilabel_margin_loss_backward",
            "aten::_ctc_loss_backward",
            "aten::batch_norm_update_stats",
            "aten::_masked_softmax",
            "aten::_masked_softmax_backward",
            "aten::fractional_max_pool3d_backward",
            "aten::binomial",
            "aten::_sample_dirichlet",
            "aten::_standard_gamma_grad",
            "aten::_dirichlet_grad",
            "aten::_native_batch_norm_legit.no_stats_out",
            "aten::_fused_adam_.tensor_lr",
            "aten::_fused_adamw_.tensor_lr",
            "aten::_fused_sgd_",
            "aten::_fused_adagrad_",
            "aten::linalg_lstsq",  # (its composite kernel calls linalg_lstsq.out, which has none)
            "aten::_thnn_fused_gru_cell",
            "aten::_aminmax",
            "aten::histogram",
            "aten::_histogramdd_bin_edges",
            "aten::_histogramdd_from_bin_cts",
            "aten::_histogramdd_from_bin_tensors",
            "aten::_to_sparse",
            "aten::_thnn_fused_gru_cell_backward",
        ],
        "no meta kernel",
    ),
    # meta kernels known to differ from CPU's (tpu follows CPU, or CUDA where said)
    "aten::_grouped_mm": "meta requires bfloat16 inputs (CUDA's limit); CPU takes float32",
    "aten::_embedding_bag": "meta's offset2bag/max_indices shapes are not CPU's",
    "aten::_embedding_bag_forward_only": "meta's offset2bag/max_indices shapes are not CPU's",
    "aten::_weight_norm_interface": "CPU returns the norms in float32 for half inputs, meta not",
    "aten::log_sigmoid_forward": "tpu leaves the buffer empty, like CUDA (meta sizes it as CPU)",
    "aten::polar": "meta asserts (AssertionError) on integer parts, CPU raises RuntimeError",
    "aten::complex": "meta asserts (AssertionError) on integer parts, CPU raises RuntimeError",
    "aten::ldexp.Tensor": "meta returns float32 for integers whatever the default dtype, CPU follows it",
}


_SAVED_STATISTICS = (
    "the saved (and updated running) statistics follow CPU: empty in eval mode, the input's "
    "dtype for half inputs; meta follows CUDA: the running stats' shape, float32"
)

#: Outputs (by position) not compared with meta, for ops whose other outputs are, with the reason.
UNCHECKED_OUTPUTS: dict[str, tuple[tuple[int, ...], str]] = {
    **dict.fromkeys(
        [
            "aten::native_batch_norm",
            "aten::_native_batch_norm_legit",
            "aten::_native_batch_norm_legit_no_training",
            "aten::_native_batch_norm_legit_functional",
            "aten::_batch_norm_with_update",
            "aten::_batch_norm_with_update_functional",
            "aten::_batch_norm_no_update",
            "aten::native_layer_norm",
        ],
        (tuple(range(1, 6)), _SAVED_STATISTICS),  # all but the normalized output
    ),
    "aten::_linalg_svd": ((2,), "CPU returns Vh column-major like U; meta row-major"),
    "aten::_scaled_dot_product_fused_attention_overrideable_backward": (
        (0, 1, 2, 3),
        "the gradients grad_input_mask leaves out are undefined (autograd's convention); meta "
        "allocates every one",
    ),
}

#: Ops whose meta kernels refuse some arguments CPU's kernels run (tpu runs them as CPU does),
#: with the reason: a refusal of theirs is not checked.
META_STRICTER: dict[str, str] = {
    "aten::arange.start_step": "for an integer dtype meta checks the step truncated to it, CPU the "
    "step itself (arange(0, 1, 0.1, dtype=int32) is ten zeros on CPU)",
    **dict.fromkeys(
        ["aten::index.Tensor", "aten::index_put.default", "aten::_index_put_impl.default"],
        "meta refuses a uint8 mask, which CPU takes (with a deprecation warning)",
    ),
}

#: Messages of meta kernels that fail on arguments CPU accepts (the upsample meta kernels on an
#: empty batch): such calls are not checked.
_META_BUGS = ("cond must be a bool",)

#: Ops whose meta kernels raise another exception type than CPU for some arguments (tpu raises
#: CPU's), with the reason: a differing type is accepted for them.
CPU_ERROR_TYPES: dict[str, str] = {
    "aten::clamp.Tensor": "without bounds meta raises ValueError, CPU RuntimeError",
    **dict.fromkeys(
        ["aten::amax", "aten::amin", "aten::aminmax"],
        "an empty reduction dim: meta raises RuntimeError, CPU IndexError",
    ),
    "aten::cat": "a 0-d tensor: meta raises IndexError (a Python slip), CPU RuntimeError",
    "aten::embedding": "a weight not 2-D: meta raises AssertionError, CPU RuntimeError",
}


class MetaMismatch(AssertionError):
    """A tpu kernel disagrees with PyTorch's Meta kernel (raised only under ``check_meta``)."""


def _unchecked(op: torch._ops.OpOverload) -> bool:
    return qualified_name(op) in UNCHECKED or op._schema.name in UNCHECKED


def _unchecked_outputs(op: torch._ops.OpOverload) -> tuple[int, ...]:
    return UNCHECKED_OUTPUTS.get(op._schema.name, ((), ""))[0]


def checked(op: torch._ops.OpOverload, kernel: Callable) -> Callable:
    """``kernel`` (the tpu kernel of ``op``), checked against ``op``'s Meta kernel on every call
    made while ``flags.check_meta`` is on (see the module docstring)."""
    if _unchecked(op):
        return kernel
    arguments = op._schema.arguments
    written = [
        (i, a.name) for i, a in enumerate(arguments) if a.alias_info is not None and a.alias_info.is_write
    ]
    tensors = {a.name: i for i, a in enumerate(arguments) if isinstance(a.type, torch.TensorType)}

    @functools.wraps(kernel)
    def run(*args, **kwargs):
        if not flags.check_meta:
            return kernel(*args, **kwargs)
        return _checked_call(op, kernel, written, tensors, args, kwargs, strides)

    entry = LOWERINGS.get(op)
    strides = entry is None or entry.layout not in (Layout.SUGGESTED, Layout.CONVOLUTION)
    return run


# ----------------------------------------------------------------------------- replay
def _replay(op, tensors: dict, args: tuple, kwargs: dict):
    """(meta arguments, meta result, None) or (meta arguments, None, PyTorch's exception)."""
    meta_args, meta_kwargs = to_meta(args), to_meta(kwargs)
    host = tensors.get("scalars")  # a _foreach_*.Tensor's ``scalars`` must stay on the host
    if host is not None and host < len(args):
        meta_args = (*meta_args[:host], args[host], *meta_args[host + 1 :])
    # A Python kernel receives the wrapped numbers of a scalar overload as numbers
    # (``x - 1.0`` calls ``sub.Tensor`` with 1.0), which the overload itself refuses: the op's
    # packet resolves them to the overload taking a Scalar, with a wrapped number's promotion.
    numbers = any(
        isinstance(args[i] if i < len(args) else kwargs.get(name), (bool, int, float, complex))
        for name, i in tensors.items()
    )
    call = getattr(torch.ops.aten, op._schema.name.split("::")[1]) if numbers else op
    return (meta_args, meta_kwargs), *call_quietly(call, meta_args, meta_kwargs)


def _checked_call(op, kernel: Callable, written, tensors: dict, args: tuple, kwargs: dict, strides: bool):
    meta_arguments, expected, rejection = _replay(op, tensors, args, kwargs)
    if rejection is not None and (
        any(text in str(rejection) for text in NEEDS_VALUES_MESSAGES + _META_BUGS)
        or qualified_name(op) in META_STRICTER
    ):
        return kernel(*args, **kwargs)
    if rejection is not None:
        try:
            kernel(*args, **kwargs)
        except Exception as error:
            # CPU kernels refuse a dtype with NotImplementedError where meta raises RuntimeError;
            # a refusal of cpu_dtypes' table (a ``stand_in``) is CPU's, whatever meta's decomposition
            # makes of that dtype
            refused_dtype = isinstance(error, NotImplementedError) and (
                type(rejection) is RuntimeError or getattr(error, "stand_in", None) is not None
            )
            cpu_type = qualified_name(op) in CPU_ERROR_TYPES
            if type(error) is not type(rejection) and not (refused_dtype or cpu_type):
                raise MetaMismatch(
                    f"{op} raised {type(error).__name__} on tpu, PyTorch raises "
                    f"{type(rejection).__name__} ({rejection}); arguments: {_describe(args, kwargs)}"
                ) from error
            raise
        raise MetaMismatch(
            f"{op} accepted arguments PyTorch rejects with {type(rejection).__name__}: "
            f"{rejection} (an op with no meta kernel belongs in meta_check.UNCHECKED); "
            f"arguments: {_describe(args, kwargs)}"
        ) from rejection
    result = kernel(*args, **kwargs)
    context = functools.partial(_describe, args, kwargs)
    _compare(op, "output", _leaves(result), _leaves(expected), context, _unchecked_outputs(op), strides)
    for position, name in written:
        _compare(
            op,
            f"argument '{name}'",
            _leaves(_argument(args, kwargs, position, name)),
            _leaves(_argument(*meta_arguments, position, name)),
            context,
        )
    return result


def _argument(args: tuple, kwargs: dict, position: int, name: str) -> Any:
    return args[position] if position < len(args) else kwargs.get(name)


def _leaves(value: Any) -> list:
    return _pytree.tree_leaves(value, is_leaf=lambda x: x is None)


# ----------------------------------------------------------------------------- comparison
def _significant_strides(t: torch.Tensor) -> tuple:
    """Strides of the dimensions longer than 1 (the only ones that address memory); none for an
    empty tensor."""
    if t.numel() == 0:
        return ()
    return tuple(s for n, s in zip(t.shape, t.stride()) if n > 1)


def _compare(
    op,
    what: str,
    actual: list,
    expected: list,
    context: Callable[[], str],
    skip: tuple[int, ...] = (),
    strides: bool = True,
) -> None:
    if len(actual) != len(expected):
        raise MetaMismatch(
            f"{op}: {len(actual)} {what} values on tpu, PyTorch gives {len(expected)}; arguments: {context()}"
        )
    for index, (tpu, meta) in enumerate(zip(actual, expected)):
        if index in skip or not isinstance(meta, torch.Tensor) or (tpu is None and meta.numel() == 0):
            continue  # numbers (meta's are placeholders), undefined outputs (meta: empty ones)
        name = f"{what} {index}" if len(expected) > 1 else what
        if not isinstance(tpu, torch.Tensor):
            raise MetaMismatch(
                f"{op} {name}: {type(tpu).__name__} on tpu, PyTorch gives a tensor; arguments: {context()}"
            )
        fields = [("shape", lambda t: tuple(t.shape)), ("dtype", lambda t: t.dtype)]
        for field, get in fields + [("strides", _significant_strides)] * strides:
            if get(tpu) != get(meta):
                detail = (
                    f" (all strides: {tpu.stride()} on tpu, {meta.stride()} in PyTorch)"
                    if field == "strides"
                    else ""
                )
                raise MetaMismatch(
                    f"{op} {name}: {field} {get(tpu)} on tpu, PyTorch's meta "
                    f"kernel gives {get(meta)}{detail}; arguments: {context()}"
                )


def _describe(args: tuple, kwargs: dict) -> str:
    """The arguments with tensors as ``dtype[shape]`` (``@strides`` if not contiguous)."""

    def text(x):
        if isinstance(x, torch.Tensor):
            layout = "" if x.is_contiguous() else f"@{tuple(x.stride())}"
            return f"{str(x.dtype).replace('torch.', '')}{list(x.shape)}{layout}"
        return x

    shown = _pytree.tree_map(text, (args, kwargs))
    return ", ".join([*map(str, shown[0]), *(f"{k}={v}" for k, v in shown[1].items())])
