"""``torch.autocast("tpu")``: per-op casting on the AutocastPrivateUse1 dispatch key.

PyTorch registers its autocast kernels for CPU, CUDA, MPS and XPU in C++ and nothing for
PrivateUse1, so without this module every op under ``torch.autocast("tpu")`` fails with "Could
not run ... with arguments from the 'Autocasttpu' backend". Here every op falls through that key
except those in :data:`POLICIES`, which follow CUDA's lists (``aten/src/ATen/autocast_mode.h``):

- ``lower``: matmuls, convolutions, linear, SDPA and RNN cells run in the autocast dtype;
- ``fp32``: ops that lose accuracy in 16 bits (exp/log/pow, norms, losses, upsampling) run in
  float32;
- ``fp32_dtype``: softmax, sums, products and cumulative ops get ``dtype=float32`` unless the
  caller chose one;
- ``promote``: multi-input ops run in the widest floating type among their inputs;
- ``banned``: ``binary_cross_entropy`` raises, as on CUDA.

Only floating tpu tensors other than float64 are cast, as on CUDA. The default autocast dtype is
bfloat16 (``torch.get_autocast_dtype("tpu")``), the TPU's native 16-bit type.

Example::

    >>> import torch, torch_tpu
    >>> a = torch.randn(4, 4, device="tpu")
    >>> with torch.autocast("tpu"):
    ...     (a @ a).dtype, torch.softmax(a, 0).dtype
    (torch.bfloat16, torch.float32)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

aten = torch.ops.aten
_KEY = "AutocastPrivateUse1"
_EXCLUDE = torch._C.DispatchKeySet(torch._C.DispatchKey.AutocastPrivateUse1)

#: op name (``name`` or ``name.overload``; a bare name means its default overload) by policy.
POLICIES: dict[str, tuple[str, ...]] = {
    "lower": (
        "_convolution.deprecated",
        "_convolution",
        "conv1d",
        "conv2d",
        "conv3d",
        "conv_tbc",
        "conv_transpose1d",
        "conv_transpose2d.input",
        "conv_transpose3d.input",
        "convolution",
        "prelu",
        "addmm",
        "addmv",
        "addr",
        "matmul",
        "einsum",
        "mm",
        "mv",
        "linalg_vecdot",
        "linear",
        "addbmm",
        "baddbmm",
        "bmm",
        "chain_matmul",
        "linalg_multi_dot",
        "_thnn_fused_lstm_cell",
        "_thnn_fused_gru_cell",
        "lstm_cell",
        "gru_cell",
        "rnn_tanh_cell",
        "rnn_relu_cell",
        "_scaled_dot_product_flash_attention",
        "scaled_dot_product_attention",
    ),
    "fp32": (
        "acos",
        "asin",
        "cosh",
        "erfinv",
        "exp",
        "expm1",
        "log",
        "log10",
        "log2",
        "log1p",
        "reciprocal",
        "rsqrt",
        "sinh",
        "tan",
        "pow.Tensor_Scalar",
        "pow.Tensor_Tensor",
        "pow.Scalar",
        "softplus",
        "layer_norm",
        "native_layer_norm",
        "group_norm",
        "frobenius_norm.dim",
        "nuclear_norm",
        "nuclear_norm.dim",
        "cosine_similarity",
        "poisson_nll_loss",
        "cosine_embedding_loss",
        "nll_loss",
        "nll_loss2d",
        "hinge_embedding_loss",
        "kl_div",
        "l1_loss",
        "smooth_l1_loss",
        "huber_loss",
        "mse_loss",
        "margin_ranking_loss",
        "multilabel_margin_loss",
        "soft_margin_loss",
        "triplet_margin_loss",
        "multi_margin_loss",
        "binary_cross_entropy_with_logits",
        "dist",
        "pdist",
        "cdist",
        "renorm",
        "logsumexp",
        "upsample_nearest1d",
        "_upsample_nearest_exact1d",
        "upsample_nearest2d",
        "_upsample_nearest_exact2d",
        "upsample_nearest3d",
        "_upsample_nearest_exact3d",
        "upsample_linear1d",
        "upsample_bilinear2d",
        "_upsample_bilinear2d_aa",
        "upsample_trilinear3d",
        "upsample_bicubic2d",
        "_upsample_bicubic2d_aa",
    ),
    "fp32_dtype": (
        "prod",
        "prod.dim_int",
        "softmax.int",
        "log_softmax.int",
        "cumprod",
        "cumsum",
        "linalg_vector_norm",
        "linalg_matrix_norm",
        "linalg_matrix_norm.str_ord",
        "sum",
        "sum.dim_IntList",
    ),
    "promote": (
        "addcdiv",
        "addcmul",
        "atan2",
        "bilinear",
        "cross",
        "dot",
        "vdot",
        "grid_sampler",
        "index_put",
        "tensordot",
        "scatter_add",
    ),
    "banned": ("binary_cross_entropy",),
}

#: ``norm`` overloads without a dtype argument, and the overload they are redirected to with
#: ``dtype=float32`` (CUDA's ``fp32_append_dtype``).
NORM_WITH_DTYPE = {"norm.Scalar": "norm.ScalarOpt_dtype", "norm.ScalarOpt_dim": "norm.ScalarOpt_dim_dtype"}

_BANNED_MESSAGE = (
    "torch.nn.functional.binary_cross_entropy and torch.nn.BCELoss are unsafe to autocast.\n"
    "Many models use a sigmoid layer right before the binary cross entropy layer.\n"
    "In this case, combine the two layers using torch.nn.functional.binary_cross_entropy_with_logits\n"
    "or torch.nn.BCEWithLogitsLoss.  binary_cross_entropy_with_logits and BCEWithLogits are\n"
    "safe to autocast."
)


def _eligible(x: Any) -> bool:
    return (
        isinstance(x, torch.Tensor)
        and x.device.type == "tpu"
        and x.is_floating_point()
        and x.dtype != torch.float64
    )


def _cast(x: Any, dtype: torch.dtype) -> Any:
    if isinstance(x, (list, tuple)):
        return type(x)(_cast(item, dtype) for item in x)
    return x.to(dtype) if _eligible(x) and x.dtype != dtype else x


def _tensors(args: tuple, kwargs: dict):
    for value in (*args, *kwargs.values()):
        if isinstance(value, (list, tuple)):
            yield from (v for v in value if isinstance(v, torch.Tensor))
        elif isinstance(value, torch.Tensor):
            yield value


def _cast_all(args: tuple, kwargs: dict, dtype: torch.dtype) -> tuple[tuple, dict]:
    return (tuple(_cast(a, dtype) for a in args), {k: _cast(v, dtype) for k, v in kwargs.items()})


def _policy_kernel(policy: str, op: torch._ops.OpOverload) -> Callable:
    """The autocast kernel for ``op`` under ``policy``; it runs ``op`` with autocast excluded,
    so the ops ``op`` decomposes into are not cast again."""
    names = [a.name for a in op._schema.arguments]
    dtype_at = names.index("dtype") if "dtype" in names else None

    def cast_args(args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        if policy == "lower":
            return _cast_all(args, kwargs, torch.get_autocast_dtype("tpu"))
        if policy == "fp32":
            return _cast_all(args, kwargs, torch.float32)
        if policy == "promote":
            widest = torch.get_autocast_dtype("tpu")
            for t in _tensors(args, kwargs):
                if _eligible(t):
                    widest = torch.promote_types(widest, t.dtype)
            return _cast_all(args, kwargs, widest)
        # fp32_dtype: only when the first argument is eligible, as on CUDA (setting a dtype
        # on other inputs could change PyTorch's own promotion).
        if dtype_at is None or not args or not _eligible(args[0]):
            return args, kwargs
        if len(args) > dtype_at:
            if args[dtype_at] is None:
                args = (*args[:dtype_at], torch.float32, *args[dtype_at + 1 :])
        elif kwargs.get("dtype") is None:
            kwargs = {**kwargs, "dtype": torch.float32}
        return args, kwargs

    def kernel(*args: Any, **kwargs: Any) -> Any:
        if policy == "banned":
            raise RuntimeError(_BANNED_MESSAGE)
        with torch._C._ExcludeDispatchKeyGuard(_EXCLUDE):
            args, kwargs = cast_args(args, kwargs)
            return op(*args, **kwargs)

    kernel.__name__ = f"autocast_{policy}_{op.__name__.replace('.', '_')}"
    return kernel


def _norm_kernel(target: torch._ops.OpOverload) -> Callable:
    def kernel(x: torch.Tensor, *args: Any) -> Any:
        with torch._C._ExcludeDispatchKeyGuard(_EXCLUDE):
            return target(x, *args, dtype=torch.float32 if _eligible(x) else x.dtype)

    return kernel


def _overload(name: str) -> torch._ops.OpOverload | None:
    packet_name, _, overload = name.partition(".")
    packet = getattr(aten, packet_name, None)
    if packet is None or (overload or "default") not in packet.overloads():
        return None  # not in this PyTorch build (the lists span releases)
    return getattr(packet, overload or "default")


_libraries: list[torch.library.Library] = []


def registered_ops() -> dict[str, str]:
    """The ops with a tpu autocast kernel in this PyTorch build, with their policy."""
    table = {
        name: policy for policy, names in POLICIES.items() for name in names if _overload(name) is not None
    }
    table.update({name: "fp32_dtype" for name in NORM_WITH_DTYPE if _overload(name) is not None})
    return table


def install() -> None:
    """Register the fallthrough and the per-op kernels; default the autocast dtype to bfloat16."""
    fallthrough = torch.library.Library("_", "IMPL")
    fallthrough.fallback(torch.library.fallthrough_kernel, _KEY)
    kernels = torch.library.Library("aten", "IMPL")
    for name, policy in registered_ops().items():
        kernel = (
            _norm_kernel(_overload(NORM_WITH_DTYPE[name]))
            if name in NORM_WITH_DTYPE
            else _policy_kernel(policy, _overload(name))
        )
        kernels.impl(name, kernel, _KEY)
    _libraries[:] = [fallthrough, kernels]
    # The dtype lives in a thread-local that starts as float16 for PrivateUse1; this sets it for
    # the importing thread (the one that runs models in practice). Other threads keep float16
    # unless they call torch.set_autocast_dtype("tpu", torch.bfloat16) or pass dtype= explicitly.
    torch.set_autocast_dtype("tpu", torch.bfloat16)
