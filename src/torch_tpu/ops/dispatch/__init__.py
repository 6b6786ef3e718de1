"""Installs the op table on the PrivateUse1 ("tpu") dispatch key.

For each functional lowering the dispatcher builds one kernel object (:class:`Compute`) that
binds the schema's arguments, reads tpu tensors as JAX arrays, computes promoted dtypes, calls
the (jitted) lowering and keeps plans for calls that repeat; the kernel wraps its results. In-place
and ``out=`` overloads are derived from the same lowering by matching schemas. Ops with no lowering
reach a boxed fallback that raises ``NotImplementedError`` (or, when opted in with
``TORCH_TPU_CPU_FALLBACK=1``, runs them on CPU and counts it).

Modules, in the order a call meets them:

- ``binding``: argument kinds, defaults, the :class:`Binder`;
- ``conversion``: arguments as the lowering's (arrays, device scalars, static values);
- ``promoting``: the promoted dtypes of elementwise ops;
- ``kernel``: :class:`Compute`, the call's steps (fast path, general path, run, learning plans);
- ``plans``: the plan records, shared by name with the C++ core;
- ``programs``: wrappers making a lowering a program (padding, host copies, memory order);
- ``errors``: PyTorch's exceptions for refused calls;
- ``variants``: the functional kernel and the derived in-place / ``out=`` kernels;
- ``routing``: ops taking ``device=``;
- ``fallback``: ops with no lowering;
- ``registration``: the registration (``install``);
- ``recording``: which ops were reached (the state the C++ core reads).
"""

from __future__ import annotations

from .binding import Binder
from .conversion import FittedNumber, fitted_dtype
from .fallback import fallback
from .kernel import Compute
from .programs import HOST_SHADOW_ELEMENTS
from .promoting import operand_signature, promoted, promoted_types
from .recording import cpu_fallback_counts, record_ops
from .registration import DERIVED, SERVED_BY_THE_CORE, check_installable, install, kernel_of, libraries
from .routing import current_device

__all__ = [
    "DERIVED",
    "HOST_SHADOW_ELEMENTS",
    "SERVED_BY_THE_CORE",
    "Binder",
    "Compute",
    "FittedNumber",
    "check_installable",
    "cpu_fallback_counts",
    "current_device",
    "fallback",
    "fitted_dtype",
    "install",
    "kernel_of",
    "libraries",
    "operand_signature",
    "promoted",
    "promoted_types",
    "record_ops",
]


def __getattr__(name: str):
    if name == "recorded_ops":  # (rebound by record_ops: read where it lives)
        from ...runtime.flags import flags

        return flags.recorded_ops
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
