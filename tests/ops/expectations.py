"""What the OpInfo harness expects per op: tolerances, known mismatches, untestable samples.

Keys are OpInfo names (``op.name`` plus ``.variant_test_name`` when present). Every entry says
why; an xfail that starts passing fails the test (strict), so this table cannot rot silently.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch
from torch.testing._internal.opinfo.core import SampleInput


@dataclasses.dataclass(frozen=True)
class Tolerance:
    atol: float
    rtol: float
    dtypes: tuple[torch.dtype, ...] | None = None  # None: all dtypes


@dataclasses.dataclass(frozen=True)
class XFail:
    reason: str
    dtypes: tuple[torch.dtype, ...] | None = None
    phases: tuple[str, ...] = ("forward",)  # "forward" and/or "backward"


#: Ops whose values are random: the harness checks shape, dtype and device, not values.
RANDOM_OPS = frozenset(
    {
        "bernoulli",
        "normal",
        "normal.number_mean",
        "normal.in_place",
        "rand_like",
        "randn_like",
        "randint_like",
        "randint",
        "uniform",
        "multinomial",
        "nn.functional.dropout",
        "nn.functional.dropout2d",
        "nn.functional.dropout3d",
        "nn.functional.alpha_dropout",
        "nn.functional.feature_alpha_dropout.with_train",
        "nn.functional.feature_alpha_dropout.without_train",
        "cauchy",
        "exponential",
        "geometric",
        "log_normal",
        "randn",
        "rand",
        "empty",
        "empty_like",
        "new_empty",
        "empty_strided",
        "new_empty_strided",
        "empty_permuted",
        "nn.functional.rrelu",
        "randperm",
        "torch._scaled_dot_product_efficient_attention",
        # the pooling windows come from torch.rand on the input's device (tpu draws other numbers
        # than CPU); tests/ops/test_nn_overloads.py compares them with the samples passed in
        "nn.functional.fractional_max_pool2d",
        "nn.functional.fractional_max_pool3d",
    }
)

#: Ops random only in some samples (dropout in training): those samples check shape, dtype and
#: device and are left out of the gradient check; the others must match CPU.
RANDOM_SAMPLES: dict[str, Callable[[SampleInput], bool]] = {
    "nn.functional.scaled_dot_product_attention": lambda s: s.kwargs.get("dropout_p", 0.0) > 0,
    # F.multi_head_attention_forward(query, key, value, embed_dim, num_heads, in_proj_weight,
    # in_proj_bias, bias_k, bias_v, add_zero_attn, dropout_p, ...)
    "nn.functional.multi_head_attention_forward": lambda s: s.kwargs.get("training", True) and s.args[9] > 0,
}

_HALF = (torch.float16, torch.bfloat16)

#: The plain tolerance per OpInfo name (one entry, or a tuple of entries for different dtypes),
#: where assert_close's default for the result's dtype is not right. The harness adds to it a
#: multiple of CPU's own distance from a float64 reference (``torch_tpu.testing.reference``),
#: so an entry is needed only where tpu is less accurate than CPU, or where CPU is so far from
#: exact that the derived allowance reaches its cap.
TOLERANCES: dict[str, Tolerance | tuple[Tolerance, ...]] = {
    # XLA's transcendental approximations differ from glibc's by a few ulp; half types round the
    # float32 result once more.
    "default-half": Tolerance(atol=1e-2, rtol=1.6e-2, dtypes=_HALF),
    # XLA's float32 erfinv is ~10x further from a float64 reference than CPU's (1.1e-6 against
    # 1.1e-7 on the samples), and d/dx erfinv = sqrt(pi)/2 * exp(erfinv(x)^2) grows fast near
    # +-1: there tpu's gradient is 1.8e-4 from the reference, CPU's 2.3e-5. 10x the default.
    "erfinv": Tolerance(atol=1e-4, rtol=1.3e-5, dtypes=(torch.float32,)),
    # PyTorch's logcumsumexp backward (exp of a reversed logcumsumexp of log|grad| - result,
    # positive and negative parts subtracted) cancels in float32: CPU and tpu are each ~1e-3
    # from a float64 reference on gradients of size ~1, past the derived allowance's cap.
    "logcumsumexp": Tolerance(atol=1e-3, rtol=1.3e-6, dtypes=(torch.float32,)),
}

#: Ops with an argument PyTorch requires on the CPU (as it does on CUDA): left there.
CPU_ARGUMENT_OPS = frozenset({"tensor_split"})

#: Ops returning indices of equal values in no defined order (CPU's unstable sort and its
#: quickselect pick any of the tied elements): tpu's indices are checked for what they select,
#: not compared with CPU's. The number is where ``dim`` sits in the samples' positional args.
TIE_BREAK_OPS: dict[str, int] = {"sort": 0, "argsort": 0, "topk": 1, "kthvalue": 1}

#: Ops whose vectors are defined only up to a sign (a phase, if complex) each, which LAPACK
#: builds and XLA choose differently: compared through the samples' output_process_fn_grad,
#: the OpInfo's own sign-free view of them (|eigenvectors|; U @ V^H and S for the low-rank SVDs,
#: whose random start is then irrelevant, as the samples' rank is at most q).
SIGN_FREE_OPS = frozenset({"linalg.eigh", "svd_lowrank", "pca_lowrank"})

XFAILS: dict[str, XFail] = {
    "nn.functional.soft_margin_loss": XFail(
        "CPU's float16 log1p(exp(-target * x)) overflows to inf (exp in float16 past 65504); "
        "tpu computes in float32 (opmath) and returns the finite loss",
        dtypes=(torch.float16,),
    ),
    "matrix_exp": XFail(
        "CPU's float16/bfloat16 matrix_exp returns NaN for the samples (norms ~30); "
        "tpu computes in float32 and returns the float32 result rounded",
        dtypes=(torch.float16, torch.bfloat16),
    ),
    "as_strided.partial_views": XFail(
        "the samples read storage outside the viewed tensor; .to() copies only the view's "
        "elements (as it does for CUDA), so that storage is not there",
        phases=("forward", "backward"),
    ),
}

#: Error inputs (``tests/ops/test_error_inputs.py``) on which tpu's exception differs from CPU's:
#: OpInfo name -> {index of the ErrorInput: why}.
_CONV = "convolution's argument checks (stride, padding, dilation, weight rank): meta replays, other order"
_INDEX_RANK = "scatter/gather check index bounds before CPU's rank/size checks (the rank check is missing)"

ERROR_XFAILS: dict[str, dict[int, str]] = {
    "dot": {
        0: "dtype mismatch worded by the shared linalg dtype check, not CPU's 'dot : expected both vectors'"
    },
    "vdot": {
        0: "dtype mismatch worded by the shared linalg dtype check, not CPU's 'dot : expected both vectors'"
    },
    "gather": {0: _INDEX_RANK},
    "scatter": {2: _INDEX_RANK},
    "scatter_add": {2: _INDEX_RANK},
    "masked_scatter": {
        0: "a non-bool mask is refused with another message than CPU's 'only supports boolean masks'",
        1: "a non-bool mask is refused with another message than CPU's 'only supports boolean masks'",
    },
    "nn.functional.conv1d": dict.fromkeys((2, 4, 5, 6, 7), _CONV),
    "nn.functional.conv2d": dict.fromkeys((2, 4, 6, 7), _CONV),
    "nn.functional.conv3d": dict.fromkeys((2, 4, 6, 7), _CONV),
}
