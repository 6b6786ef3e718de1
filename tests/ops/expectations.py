"""What the OpInfo harness expects per op: tolerances, known mismatches, untestable samples.

Keys are OpInfo names (``op.name`` plus ``.variant_test_name`` when present). Every entry says
why; an xfail that starts passing fails the test (strict), so this table cannot rot silently.
"""
from __future__ import annotations

import dataclasses
from typing import Optional

import torch


@dataclasses.dataclass(frozen=True)
class Tolerance:
    atol: float
    rtol: float
    dtypes: Optional[tuple[torch.dtype, ...]] = None  # None: all dtypes


@dataclasses.dataclass(frozen=True)
class XFail:
    reason: str
    dtypes: Optional[tuple[torch.dtype, ...]] = None
    backward_only: bool = False


#: Ops whose values are random: the harness checks shape, dtype and device, not values.
RANDOM_OPS = frozenset({
    "bernoulli", "normal", "normal.number_mean", "normal.in_place", "rand_like", "randn_like",
    "randint_like", "randint", "uniform", "multinomial", "nn.functional.dropout",
    "nn.functional.dropout2d", "nn.functional.dropout3d", "nn.functional.alpha_dropout",
    "nn.functional.feature_alpha_dropout.with_train", "nn.functional.feature_alpha_dropout.without_train",
    "cauchy", "exponential", "geometric", "log_normal", "randn", "rand", "empty", "empty_like",
    "new_empty", "empty_strided", "new_empty_strided", "empty_permuted", "nn.functional.rrelu",
    "randperm", "torch._scaled_dot_product_efficient_attention",
})

_HALF = (torch.float16, torch.bfloat16)

TOLERANCES: dict[str, Tolerance] = {
    # XLA's transcendental approximations differ from glibc's by a few ulp; half types round the
    # float32 result once more.
    "default-half": Tolerance(atol=1e-2, rtol=1.6e-2, dtypes=_HALF),
    # d/dx erfinv = sqrt(pi)/2 * exp(erfinv(x)^2) grows fast near +-1: one float32 ulp of
    # erfinv there moves the gradient by ~6e-6 relative.
    "erfinv": Tolerance(atol=1e-3, rtol=1e-5, dtypes=(torch.float32,)),
}

#: Ops with an argument PyTorch requires on the CPU (as it does on CUDA): left there.
CPU_ARGUMENT_OPS = frozenset({"tensor_split"})

XFAILS: dict[str, XFail] = {
    "as_strided.partial_views": XFail(
        "the samples read storage outside the viewed tensor; .to() copies only the view's "
        "elements (as it does for CUDA), so that storage is not there"),
    "float_power": XFail("float_power of complex64 returns complex128, a dtype tpu does not have",
                         dtypes=(torch.complex64,)),
    "logaddexp": XFail("complex logaddexp: XLA picks another branch of the complex log "
                       "(imaginary parts differ by 2*pi)", dtypes=(torch.complex64,)),
}
