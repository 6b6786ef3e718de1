"""``torch.tpu.compiler``: the options XLA compiles with, process-wide and per ``torch.compile``.

The programs that run many times (fused graphs, ``torch.compile``'s programs, captured graphs)
compile with :func:`program_options`: the process's options (:func:`set_options`), then a
``torch.compile`` call's own (``options=`` of the ``"tpu"`` backend) over them. Strict eager's
per-op programs compile with XLA's defaults, except for the two efforts, which are JAX's
process-wide settings and so reach every program.

An option is one of :data:`KNOWN` or any XLA debug option (``xla_...``, as ``XLA_FLAGS`` spells it
without the dashes); XLA itself says which names exist, and a name it refuses is refused here
with the known ones listed.

>>> import torch, torch_tpu
>>> torch.tpu.compiler.set_options(optimization_level=1)
>>> torch.tpu.compiler.get_options()
{'optimization_level': 1}
>>> torch.tpu.compiler.reset_options()

:func:`reset` forgets every program compiled in the process, as ``torch.compiler.reset()`` does
for Dynamo's graphs.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from collections.abc import Callable, Iterator
from typing import Any

from . import callbacks, platform
from .lru import caches


@dataclasses.dataclass(frozen=True)
class Option:
    """A named option: what it sets, its check, what it means."""

    name: str
    check: Callable[[Any], bool]
    expects: str
    doc: str
    #: the XLA debug option it sets, or None for a JAX setting (``jax_config``)
    xla: str | None = None
    jax_config: str | None = None


def _effort(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and -1.0 <= value <= 1.0


KNOWN = {
    o.name: o
    for o in (
        Option(
            "optimization_level",
            lambda v: isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= 3,
            "an int from 0 to 3",
            "XLA's backend optimization level (LLVM's -O level on CPU and GPU)",
            xla="xla_backend_optimization_level",
        ),
        Option(
            "exec_time_optimization_effort",
            _effort,
            "a number from -1 to 1",
            "how hard XLA works for a faster program (-1: compile fast, 1: run fast), every program",
            jax_config="jax_exec_time_optimization_effort",
        ),
        Option(
            "memory_fitting_effort",
            _effort,
            "a number from -1 to 1",
            "how hard XLA works to fit a program in device memory, every program",
            jax_config="jax_memory_fitting_effort",
        ),
    )
}


class _Options:
    """The process's compiler options (one owner: this object), and :attr:`token`, the same as a
    key that in-process caches of programs compiled with them include (kept, not computed per
    call: fused graphs and compiled programs read it on every run)."""

    def __init__(self) -> None:
        self.values: dict[str, Any] = {}
        self.token: tuple = ()

    def replace(self, values: dict[str, Any]) -> None:
        self.values = dict(values)
        self.token = tuple(sorted(self.values.items()))


_process = _Options()


def known_names() -> str:
    return ", ".join(sorted(KNOWN)) + ", or an XLA debug option (xla_...)"


def is_option(name: str) -> bool:
    """Whether ``name`` is a known option or an XLA debug option XLA has."""
    return name in KNOWN or (name.startswith("xla_") and _xla_has(name))


def check(options: dict[str, Any], per_call: bool = False) -> None:
    """Raise for an option that is neither known nor accepted by XLA, or a bad value;
    ``per_call`` (a ``torch.compile`` call's options): also for a process-wide one."""
    for name, value in options.items():
        option = KNOWN.get(name)
        if option is not None:
            if not option.check(value):
                raise ValueError(
                    f"torch.tpu.compiler option {name!r} must be {option.expects}, got {value!r}"
                )
            if per_call and option.jax_config is not None:
                raise ValueError(
                    f"torch.tpu.compiler option {name!r} is process-wide: set it with "
                    "torch.tpu.compiler.set_options, not per torch.compile call"
                )
        elif not is_option(name):
            raise ValueError(f"unknown torch.tpu.compiler option {name!r}; known options: {known_names()}")
        elif not _xla_accepts(name, value):
            raise ValueError(f"XLA refuses {name}={value!r} (torch.tpu.compiler option)")


def _trial_compile(options: dict[str, Any]) -> str | None:
    """XLA's error compiling a trivial program with ``options``; None where it compiles."""
    import jax
    import jax.numpy as jnp

    platform.initialize()
    try:
        jax.jit(lambda x: x + 1).lower(jnp.zeros(1)).compile(options)
    except Exception as error:  # (XLA's INVALID_ARGUMENT: "No such compile option", a bad value)
        return str(error)
    return None


@functools.lru_cache(maxsize=256)
def _xla_has(name: str) -> bool:
    """Whether XLA has a debug option ``name`` (it names the ones it lacks)."""
    error = _trial_compile({name: "0"})
    return error is None or "No such compile option" not in error


@functools.lru_cache(maxsize=256)
def _xla_accepts(name: str, value: Any) -> bool:
    return _trial_compile({name: value}) is None


def xla_options(options: dict[str, Any]) -> dict[str, Any]:
    """The XLA debug options ``options`` (checked) stand for."""
    out = {}
    for name, value in options.items():
        option = KNOWN.get(name)
        if option is None:
            out[name] = value
        elif option.xla is not None:
            out[option.xla] = value
    return out


def set_options(**options: Any) -> None:
    """Set process-wide compiler options (merged with those set before): they apply to the
    programs compiled from now on (fused graphs and ``torch.compile``'s; the efforts to every
    program). Programs already compiled keep theirs."""
    check(options)
    _process.replace({**_process.values, **options})
    _apply_jax_settings()


def get_options() -> dict[str, Any]:
    """The process-wide compiler options set (a copy)."""
    return dict(_process.values)


def reset_options() -> None:
    """Back to XLA's defaults."""
    _process.replace({})
    _apply_jax_settings()


def reset() -> None:
    """Forget every program compiled in this process (JAX's and torch_tpu's caches) and what
    torch_tpu learned of the workload (which sizes change, which fused ops change shape): the
    next calls trace and compile as in a fresh process, reading the persistent cache on disk
    (``TORCH_TPU_CACHE_DIR``), which stays. Call it outside compiled code; pending fused graphs
    run first.

    >>> torch.tpu.compiler.reset()
    """
    import jax

    if platform.is_initialized():
        callbacks.synchronize(0)  # (torch.tpu.synchronize: pending graphs run first)
    jax.clear_caches()
    caches.clear()


@contextlib.contextmanager
def options(**values: Any) -> Iterator[None]:
    """Process-wide compiler options for a block (``with torch.tpu.compiler.options(...):``);
    the ones before it come back at its end."""
    before = get_options()
    set_options(**values)
    try:
        yield
    finally:
        _process.replace(before)
        _apply_jax_settings()


def _apply_jax_settings() -> None:
    import jax

    for option in KNOWN.values():
        if option.jax_config is not None:
            jax.config.update(option.jax_config, float(_process.values.get(option.name, 0.0)))


def program_options(per_call: dict[str, Any] | None = None) -> dict[str, Any]:
    """The XLA options of a program that runs many times: the process's, then ``per_call``'s
    (a ``torch.compile`` call's options) over them."""
    merged = {**_process.values, **(per_call or {})}
    return xla_options(merged)


def token() -> tuple:
    """The process's options as a hashable key (empty: XLA's defaults)."""
    return _process.token


#: what a program that must run fast asks for where compiles are quick (:func:`optimized`)
_OPTIMIZED = {
    "xla_backend_optimization_level": 2,
    "xla_llvm_disable_expensive_passes": False,
    "xla_cpu_use_fusion_emitters": True,
}


def optimized(per_call: dict | None = None) -> dict | None:
    """The compile options of a program that runs many times (a fused graph, a compiled model):
    full optimization where per-op programs compile quickly (``platform._quick_compiles``), then the
    process's ``torch.tpu.compiler`` options and ``per_call``'s (a ``torch.compile`` call's)."""
    chosen = {**(_OPTIMIZED if platform.quick_compiles else {}), **program_options(per_call)}
    return chosen or None
