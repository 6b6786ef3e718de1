"""What the OpInfo harness expects per op: tolerances, known mismatches, untestable samples.

Keys are OpInfo names (``op.name`` plus ``.variant_test_name`` when present). Every entry says
why; an xfail that starts passing fails the test (strict), so this table cannot rot silently.
"""
from __future__ import annotations

import dataclasses
from typing import Callable, Optional

import torch
from torch.testing._internal.opinfo.core import SampleInput


@dataclasses.dataclass(frozen=True)
class Tolerance:
    atol: float
    rtol: float
    dtypes: Optional[tuple[torch.dtype, ...]] = None  # None: all dtypes


@dataclasses.dataclass(frozen=True)
class XFail:
    reason: str
    dtypes: Optional[tuple[torch.dtype, ...]] = None
    phases: tuple[str, ...] = ("forward",)  # "forward" and/or "backward"


#: Ops whose values are random: the harness checks shape, dtype and device, not values.
RANDOM_OPS = frozenset({
    "bernoulli", "normal", "normal.number_mean", "normal.in_place", "rand_like", "randn_like",
    "randint_like", "randint", "uniform", "multinomial", "nn.functional.dropout",
    "nn.functional.dropout2d", "nn.functional.dropout3d", "nn.functional.alpha_dropout",
    "nn.functional.feature_alpha_dropout.with_train", "nn.functional.feature_alpha_dropout.without_train",
    "cauchy", "exponential", "geometric", "log_normal", "randn", "rand", "empty", "empty_like",
    "new_empty", "empty_strided", "new_empty_strided", "empty_permuted", "nn.functional.rrelu",
    "randperm", "torch._scaled_dot_product_efficient_attention",
    # the pooling windows come from torch.rand on the input's device (tpu draws other numbers
    # than CPU); tests/ops/test_nn_overloads.py compares them with the samples passed in
    "nn.functional.fractional_max_pool2d", "nn.functional.fractional_max_pool3d",
})

#: Ops random only in some samples (dropout in training): those samples check shape, dtype and
#: device and are left out of the gradient check; the others must match CPU.
RANDOM_SAMPLES: dict[str, Callable[[SampleInput], bool]] = {
    "nn.functional.scaled_dot_product_attention": lambda s: s.kwargs.get("dropout_p", 0.0) > 0,
    # F.multi_head_attention_forward(query, key, value, embed_dim, num_heads, in_proj_weight,
    # in_proj_bias, bias_k, bias_v, add_zero_attn, dropout_p, ...)
    "nn.functional.multi_head_attention_forward":
        lambda s: s.kwargs.get("training", True) and s.args[9] > 0,
}

_HALF = (torch.float16, torch.bfloat16)
_COL2IM_HALF = (Tolerance(atol=1.0, rtol=1.6e-2, dtypes=(torch.bfloat16,)),
                Tolerance(atol=0.125, rtol=1.6e-2, dtypes=(torch.float16,)))

#: One entry per OpInfo name, or a tuple of entries for different dtypes.
TOLERANCES: dict[str, Tolerance | tuple[Tolerance, ...]] = {
    # XLA's transcendental approximations differ from glibc's by a few ulp; half types round the
    # float32 result once more.
    "default-half": Tolerance(atol=1e-2, rtol=1.6e-2, dtypes=_HALF),
    # d/dx erfinv = sqrt(pi)/2 * exp(erfinv(x)^2) grows fast near +-1: one float32 ulp of
    # erfinv there moves the gradient by ~6e-6 relative.
    "erfinv": Tolerance(atol=1e-3, rtol=1e-5, dtypes=(torch.float32,)),
    "addbmm": (
        # CPU's addbmm is a loop of addmm_ that rounds the running sum to bfloat16 after every
        # batch; tpu sums all batches in float32 and rounds once (on the samples 0.39 from a
        # float64 reference, CPU 1.02). The sums reach ~370, where a bfloat16 ulp is 2.
        Tolerance(atol=2.0, rtol=1.6e-2, dtypes=(torch.bfloat16,)),
        # sums up to ~2.4e3 (float32 ulp 2.4e-4) rounded in another order than CPU's cgemm:
        # both are ~2e-4 from a complex128 reference; entries with cancellation fail rtol
        Tolerance(atol=1e-3, rtol=1.3e-6, dtypes=(torch.complex64,)),
    ),
    # as addbmm's complex64 entry (sums up to ~1e3; both ~1e-4 from a complex128 reference)
    "baddbmm": Tolerance(atol=1e-3, rtol=1.3e-6, dtypes=(torch.complex64,)),
    # cond = smax/smin carries a relative error ~ cond * eps: the samples' cond ~60 gives
    # 2e-6 (tpu is 3e-6 from a complex128 reference, CPU 1.4e-4); 5e-5 allows cond up to ~400
    "linalg.cond": Tolerance(atol=1e-5, rtol=5e-5, dtypes=(torch.complex64,)),
    # PyTorch's logcumsumexp backward (exp of a reversed logcumsumexp of log|grad| - result,
    # positive and negative parts subtracted) cancels in float32: CPU and tpu are each ~1e-3
    # from the same formula in float64 on the samples
    "logcumsumexp": Tolerance(atol=5e-3, rtol=1.3e-6, dtypes=(torch.float32,)),
    # CPU's transposed convolution scatters its column products back (col2im) and adds the
    # overlapping taps in the half type itself, rounding at every add; tpu accumulates in
    # float32 and rounds once (on the samples 0.25 from a float64 reference, CPU 0.56). The
    # partial sums reach ~200: atol is one bfloat16 (float16) ulp there.
    "nn.functional.conv_transpose2d": _COL2IM_HALF,
    "nn.functional.conv_transpose3d": _COL2IM_HALF + (
        # sums of terms up to ~300 (float32 ulp 3e-5) in another order than CPU's: both are
        # ~6e-5 from a complex128 reference; entries with cancellation fail rtol
        Tolerance(atol=1e-4, rtol=1.3e-6, dtypes=(torch.complex64,)),
    ),
    # CPU's bfloat16 adaptive average is ~1 ulp of the inputs (|x| <= 9: 0.0625) from a float64
    # reference on the samples (0.04), tpu's is half an ulp of the result (0.016); small
    # averages of large inputs then differ by more than atol
    "nn.functional.adaptive_avg_pool3d": Tolerance(atol=6.25e-2, rtol=1.6e-2,
                                                   dtypes=(torch.bfloat16,)),
    # CPU's gamma gradient sums dy * (rstd * x - rstd * mean), which for a one-element
    # normalization (x == mean, rstd = 1/sqrt(eps) = 316) is rounding noise of rstd * x: up to
    # half an ulp of 316 * 9 (1.2e-4) per batch row; tpu's (x - mean) * rstd gives the exact 0
    # a float64 reference gives (CPU 2.4e-5 on the samples)
    "nn.functional.layer_norm": Tolerance(atol=2.5e-4, rtol=1.3e-6, dtypes=(torch.float32,)),
    # the CTC gradient is exp(log_probs) minus exp(log(alpha * beta) + nll - log_probs), both
    # ~1 where a frame is certain: the log-space alpha/beta recursions over ~50 frames round in
    # another order than CPU's, and the cancellation leaves differences up to 6e-5
    "nn.functional.ctc_loss": Tolerance(atol=1e-4, rtol=1.3e-6, dtypes=(torch.float32,)),
    # Pade approximants of another degree and scaling than CPU's: both are accurate relative to
    # the matrix, not per entry (float32 samples reach 9.3e4: CPU is 0.050 and tpu 0.031 from a
    # float64 reference; complex64 entries reach 2.8e7, each side ~3e-6 relative to it). The
    # backward is matrix_exp of a doubled matrix (float32 0.021 apart, 1e-5 relative).
    # float32 backward through XLA's SVD (pinv) and Householder products instead of LAPACK's:
    # single entries of size ~5-10 differ from CPU by 1e-5 to 4e-5 (relative 3e-6 to 9e-6)
    "linalg.lstsq": Tolerance(atol=1e-5, rtol=5e-6, dtypes=(torch.float32,)),
    "linalg.lstsq.grad_oriented": Tolerance(atol=1e-5, rtol=5e-6, dtypes=(torch.float32,)),
    "linalg.householder_product": Tolerance(atol=1e-5, rtol=1.2e-5, dtypes=(torch.float32,)),
    "matrix_exp": (Tolerance(atol=0.1, rtol=1.3e-6, dtypes=(torch.float32,)),
                   Tolerance(atol=1e-5, rtol=5e-6, dtypes=(torch.complex64,))),
    # CPU's float16 grid sampler rounds every intermediate (coordinates, tap weights, each of
    # the 16 bicubic products and partial sums) to float16; tpu's fused elementwise chain
    # rounds less often. With samples up to ~9 (float16 ulp 0.0078) the sums differ by ~2 ulp.
    "grid_sampler_2d": Tolerance(atol=2e-2, rtol=1.6e-2, dtypes=(torch.float16,)),
    # the grid's gradient sums C channels x 8 corners of products (values up to ~9) in another
    # order than CPU's loop: a few entries differ by ~5e-5, a few float32 ulp of the terms
    "grid_sampler_3d": Tolerance(atol=1e-4, rtol=1e-4, dtypes=(torch.float32,)),
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
        dtypes=(torch.float16,)),
    "matrix_exp": XFail("CPU's float16/bfloat16 matrix_exp returns NaN for the samples (norms ~30); "
                        "tpu computes in float32 and returns the float32 result rounded",
                        dtypes=(torch.float16, torch.bfloat16)),
    "as_strided.partial_views": XFail(
        "the samples read storage outside the viewed tensor; .to() copies only the view's "
        "elements (as it does for CUDA), so that storage is not there",
        phases=("forward", "backward")),
}
