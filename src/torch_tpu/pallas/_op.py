"""``jax_op``: a JAX function as a ``torch.library`` custom op whose tpu kernel is a lowering.

The op's schema comes from the function's annotations (``jax.Array`` -> ``Tensor``, Python
scalars and strings -> static arguments, part of the compile cache key). Its tpu kernel is built
by the dispatcher from a ``Lowering`` entry exactly as ATen's are, so strict eager, fused eager,
``torch.compile`` and export all run it with no code of their own. Its fake kernel is
``jax.eval_shape`` of the function; JAX's tracing errors become PyTorch-style errors naming the op
and its arguments. Pallas calls inside run in TPU interpret mode off TPU (:func:`interpret_mode`).
"""

from __future__ import annotations

import collections.abc
import functools
import inspect
import json
import types
import typing
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import torch

from ._interpret import interpret_mode

_SCALARS = {bool: "bool", int: "int", float: "float", str: "str"}


# ----------------------------------------------------------------------------- the schema
def _annotation_error(name: str, what: str, hint: Any) -> TypeError:
    return TypeError(
        f"jax_op {name!r}: {what} is annotated {hint!r}; annotate arrays jax.Array (or "
        "jax.Array | None, list[jax.Array]) and static arguments bool, int, float or str (or "
        "lists / Optional of them); return jax.Array, a tuple of them, list[jax.Array] or None"
    )


def _schema_type(hint: Any, name: str, what: str) -> str:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType) and len(args) == 2 and type(None) in args:
        inner = _schema_type(args[0] if args[1] is type(None) else args[1], name, what)
        if not inner.endswith("?"):
            return inner + "?"
    elif origin in (list, tuple, collections.abc.Sequence) and args:
        element = args[0]
        if all(a is element or a is Ellipsis for a in args[1:]):
            inner = _schema_type(element, name, what)
            if inner.isidentifier():
                return inner + "[]"
    elif hint is jax.Array:
        return "Tensor"
    elif hint in _SCALARS:
        return _SCALARS[hint]
    raise _annotation_error(name, what, hint)


def _return_types(hint: Any, name: str) -> list[str]:
    if hint is None or hint is type(None):
        return []
    if hint is jax.Array:
        return ["Tensor"]
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is tuple and args and Ellipsis not in args and all(a is jax.Array for a in args):
        return ["Tensor"] * len(args)
    if origin in (list, tuple, collections.abc.Sequence) and args and args[0] is jax.Array:
        return ["Tensor[]"]
    raise _annotation_error(name, "the return value", hint)


def _default_text(value: Any) -> str:
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(map(_default_text, value)) + "]"
    return repr(value)  # None, True, 3, 0.5


def _hints(fn: Callable) -> dict:
    while isinstance(fn, functools.partial):
        fn = fn.func
    return typing.get_type_hints(inspect.unwrap(fn))


class _Signature:
    """The schema of a JAX function, and how to call it with values in schema order."""

    def __init__(self, name: str, fn: Callable):
        bound = set(fn.keywords) if isinstance(fn, functools.partial) else set()
        try:
            hints = _hints(fn)
        except Exception as e:  # noqa: BLE001  (an annotation that does not resolve)
            raise TypeError(f"jax_op {name!r}: cannot read the annotations of {fn!r}: {e}") from e
        params = [p for p in inspect.signature(fn).parameters.values() if p.name not in bound]
        declared, self.keywords, self.types = [], [], []
        for p in params:
            if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
                raise TypeError(f"jax_op {name!r}: *{p.name} parameters have no schema; name each argument")
            if p.name not in hints:
                raise TypeError(f"jax_op {name!r}: annotate parameter {p.name!r}")
            self.types.append(_schema_type(hints[p.name], name, f"parameter {p.name!r}"))
            text = f"{self.types[-1]} {p.name}"
            if p.default is not p.empty:
                text += f"={_default_text(p.default)}"
            if p.kind is p.KEYWORD_ONLY:
                if not self.keywords:
                    declared.append("*")
                self.keywords.append(p.name)
            declared.append(text)
        if "return" not in hints:
            raise TypeError(f"jax_op {name!r}: annotate the return value")
        self.returns = _return_types(hints["return"], name)
        self.arguments = ", ".join(declared)
        self.names = [p.name for p in params]
        self.count = len(params) - len(self.keywords)
        out = self.returns[0] if len(self.returns) == 1 else f"({', '.join(self.returns)})"
        self.schema = f"({self.arguments}) -> {out}"
        self.fn, self.name = fn, name

    def lowering(self) -> Callable:
        """The op's lowering: the function on values in schema order, its result checked
        against the annotation (at trace time) and shaped as the dispatcher wraps it."""
        fn, count, keywords, returns, name = self.fn, self.count, self.keywords, self.returns, self.name

        def lowering(*values):
            with interpret_mode():
                out = fn(*values[:count], **dict(zip(keywords, values[count:])))
            return _shaped(out, returns, name)

        lowering.__name__ = lowering.__qualname__ = name.replace("::", ".")
        return lowering


def _shaped(out: Any, returns: list[str], name: str) -> Any:
    """A function's result as its annotation says (one array, a tuple, a list, nothing)."""
    many = isinstance(out, (tuple, list))
    if returns == ["Tensor"] and not many and out is not None:
        return out
    if returns == ["Tensor[]"] and many:
        return list(out)
    if not returns and (out is None or out == ()):
        return ()
    if len(returns) > 1 and many and len(out) == len(returns):
        return tuple(out)
    got = f"{type(out).__name__} of {len(out)}" if many else type(out).__name__
    raise TypeError(f"{name}: the JAX function returned a {got}, but its annotation says {returns or 'None'}")


# ----------------------------------------------------------------------------- fake kernel
def _abstract(value: Any, op: str, argument: str) -> Any:
    """A tensor argument as the ``ShapeDtypeStruct`` JAX traces (lists element-wise)."""
    from ..runtime.dtypes import to_jax

    if isinstance(value, (list, tuple)) and any(isinstance(v, torch.Tensor) for v in value):
        return [_abstract(v, op, argument) for v in value]
    if not isinstance(value, torch.Tensor):
        return value
    if not all(type(d) is int for d in value.shape):
        raise RuntimeError(
            f"{op}: argument '{argument}' has symbolic dimensions {list(value.shape)}; Symbolic "
            "dimensions are not supported by JAX ops: compile with dynamic=False"
        )
    return jax.ShapeDtypeStruct(tuple(value.shape), to_jax(value.dtype))


def _describe(names: Sequence[str], values: Sequence) -> str:
    def one(v):
        if isinstance(v, jax.ShapeDtypeStruct):
            return f"{v.dtype}{list(v.shape)}"
        if isinstance(v, list) and any(isinstance(x, jax.ShapeDtypeStruct) for x in v):
            return "[" + ", ".join(map(one, v)) + "]"
        return repr(v)

    return ", ".join(f"{n}: {one(v)}" for n, v in zip(names, values))


def _is_array_like(v: Any) -> bool:
    return isinstance(v, jax.ShapeDtypeStruct) or (
        isinstance(v, list) and any(isinstance(x, jax.ShapeDtypeStruct) for x in v)
    )


def _key(v: Any) -> Any:
    if isinstance(v, jax.ShapeDtypeStruct):
        return (v.shape, v.dtype)
    if isinstance(v, list):
        return tuple(map(_key, v))
    return ("static", type(v), v)


def _output_shapes(op: str, lowering: Callable, names: Sequence[str], abstract: list) -> Any:
    """``jax.eval_shape`` of the lowering; JAX's errors tracing the user's function become
    a RuntimeError naming the op and its arguments (PyTorch's type for a shape or dtype an op
    cannot take)."""
    dynamic = [i for i, v in enumerate(abstract) if _is_array_like(v)]

    def traced(*arrays):
        values = list(abstract)
        for i, a in zip(dynamic, arrays):
            values[i] = a
        return lowering(*values)

    try:
        return jax.eval_shape(traced, *(abstract[i] for i in dynamic))
    except (TypeError, ValueError) as e:
        if str(e).startswith(op):  # (ours: an annotation the result does not match)
            raise
        raise RuntimeError(f"{op}: the JAX function failed for ({_describe(names, abstract)}): {e}") from e


def _fake(op: torch._ops.OpOverload, lowering: Callable) -> Callable:
    """The op's fake (and meta) kernel: output shapes and dtypes from ``jax.eval_shape``."""
    from ..ops.registry import qualified_name
    from ..runtime.dtypes import to_torch

    name = qualified_name(op)
    arguments = op._schema.arguments
    names = [a.name for a in arguments]
    defaults = [a.default_value if a.has_default_value() else None for a in arguments]
    shapes: dict = {}  # per argument signature: JAX traces the function once for each

    def fake(*args, **kwargs):
        values = list(args) + [kwargs.get(n, d) for n, d in zip(names[len(args) :], defaults[len(args) :])]
        abstract = [_abstract(v, name, n) for n, v in zip(names, values)]
        try:
            key = tuple(map(_key, abstract))
            out = shapes.get(key)
        except TypeError:  # an unhashable static argument
            key, out = None, None
        if out is None:
            out = _output_shapes(name, lowering, names, abstract)
            if key is not None:
                shapes[key] = out
        tensors = [t for v in values for t in (v if isinstance(v, (list, tuple)) else (v,))]
        device = next((t.device for t in tensors if isinstance(t, torch.Tensor)), torch.device("tpu"))

        def empty(s):
            return torch.empty(s.shape, dtype=to_torch(s.dtype), device=device)

        if isinstance(out, jax.ShapeDtypeStruct):
            return empty(out)
        result = [empty(s) for s in out]
        return result if isinstance(out, list) else tuple(result) if result else None

    return fake


# ----------------------------------------------------------------------------- definition
def _refusing(name: str, late: dict) -> Callable:
    """The op's kernel for every other device: tensors must be on tpu (a device error naming
    the argument); a call with no tensors at all runs on tpu. (``late`` gets the op's argument
    names and tpu kernel once the op exists.)"""

    def run(*args, **kwargs):
        for argument, value in (*zip(late["names"], args), *kwargs.items()):
            for t in value if isinstance(value, (list, tuple)) else (value,):
                if isinstance(t, torch.Tensor) and t.device.type != "tpu":
                    raise RuntimeError(
                        f"{name}: expected argument '{argument}' to be a tpu tensor, but it is on "
                        f"{t.device} (move it with .to('tpu'))"
                    )
        return late["kernel"](*args, **kwargs)

    return run


def _define(name: str, schema: str, lowering: Callable, donate: tuple[str, ...] = ()):
    """Define ``name`` with this schema; its tpu kernel is the dispatcher's for ``lowering``."""
    from ..runtime import platform

    platform.start()  # the dispatcher's machinery
    from ..ops import dispatch
    from ..ops.registry import Lowering

    late: dict = {}
    op_def = torch.library.custom_op(name, _refusing(name, late), mutates_args=(), schema=schema)
    op = op_def._opoverload
    takes_tensors = any("Tensor" in str(a.type) for a in op._schema.arguments)
    entry = Lowering(op, lowering, donate=donate, custom=True, family="pallas")
    tpu = dispatch.kernel_of(entry, check_meta=takes_tensors)
    if not op._schema.returns:
        run = tpu

        def tpu(*args, **kwargs):
            run(*args, **kwargs)

    late.update(names=[a.name for a in op._schema.arguments], kernel=tpu)
    if takes_tensors:  # (else the default kernel runs it)
        op_def.register_kernel("tpu", tpu)
    op_def.register_fake(_fake(op, lowering))
    return op_def


def _differentiable(x: Any) -> bool:
    return isinstance(x, torch.Tensor) and (x.is_floating_point() or x.is_complex())


def _vjp_lowering(name: str, lowering: Callable, tensor_pos: list[int]) -> Callable:
    """The backward's lowering: ``jax.vjp`` of ``lowering`` at the primals (values in schema
    order, then the cotangent of each output), one gradient per floating tensor input."""

    def backward(*values):
        *primals, cotangents = values
        diff = [
            i for i in tensor_pos if primals[i] is not None and jnp.issubdtype(primals[i].dtype, jnp.inexact)
        ]

        def at(*xs):
            full = list(primals)
            for i, x in zip(diff, xs):
                full[i] = x
            return lowering(*full)

        try:
            out, pullback = jax.vjp(at, *(primals[i] for i in diff))
        except (TypeError, ValueError) as e:
            raise RuntimeError(
                f"{name}: jax.vjp of the JAX function failed, so the op has no backward ({e}). "
                f"Register one with register_autograd, or define the op with autograd=False"
            ) from e
        leaves, tree = jax.tree_util.tree_flatten(out)
        cts = [
            ct.astype(leaf.dtype)
            if jnp.issubdtype(leaf.dtype, jnp.inexact)
            else np.zeros(leaf.shape, jax.dtypes.float0)  # (integer outputs have no gradient)
            for ct, leaf in zip(cotangents, leaves)
        ]
        return list(pullback(jax.tree_util.tree_unflatten(tree, cts)))

    backward.__name__ = backward.__qualname__ = name.replace("::", ".") + "_vjp"
    return backward


_SAVED = object()  # (in the backward's statics: a tensor input, among None and other values)


def _register_vjp(op_def, sig: _Signature, lowering: Callable) -> None:
    """The op's backward: a second op whose lowering is ``jax.vjp`` of this one's (so compiled
    programs trace it like any op). ``register_autograd`` called later replaces it."""
    tensor_pos = [
        i
        for i, a in enumerate(op_def._opoverload._schema.arguments)
        if str(a.type) in ("Tensor", "Optional[Tensor]")
    ]
    positional = sig.arguments.replace("*, ", "")
    backward_op = _define(
        f"{sig.name}_jax_vjp",
        f"({positional}{', ' if positional else ''}Tensor[] grad_outputs) -> Tensor[]",
        _vjp_lowering(sig.name, lowering, tensor_pos),
    )

    def setup_context(ctx, inputs, output):
        ctx.statics = [_SAVED if isinstance(x, torch.Tensor) else x for x in inputs]
        ctx.save_for_backward(*(x for x in inputs if isinstance(x, torch.Tensor)))
        outputs = output if isinstance(output, (tuple, list)) else (output,)
        ctx.outputs = [(o.shape, o.dtype, o.device) for o in outputs]

    def backward(ctx, *grads):
        saved = iter(ctx.saved_tensors)
        inputs = [next(saved) if s is _SAVED else s for s in ctx.statics]
        if len(grads) == 1 and isinstance(grads[0], (list, tuple)):  # (a Tensor[] output)
            grads = grads[0]
        grad_outputs = [
            g if g is not None else torch.zeros(shape, dtype=dtype, device=device)
            for g, (shape, dtype, device) in zip(grads, ctx.outputs)
        ]
        computed = iter(backward_op(*inputs, grad_outputs))
        return tuple(
            next(computed) if i in tensor_pos and _differentiable(x) else None for i, x in enumerate(inputs)
        )

    op_def.register_autograd(backward, setup_context=setup_context)


def jax_op(
    name: str,
    fn: Callable | None = None,
    /,
    *,
    donate_argnums: int | Sequence[int] | None = None,
    autograd: bool = True,
):
    """A JAX function as the PyTorch custom op ``torch.ops.<ns>.<name>`` (``name`` is
    ``"ns::name"``); a decorator when ``fn`` is left out. Returns the ``CustomOpDef``.

    Parameters annotated ``jax.Array`` (``jax.Array | None``, ``list[jax.Array]``) take tpu
    tensors; ``bool``/``int``/``float``/``str`` ones are static (each value compiles its own
    program). The return annotation says the outputs: ``jax.Array``, a tuple of them,
    ``list[jax.Array]`` or ``None``.

    ``donate_argnums``: positions of array arguments whose buffers strict eager gives to the
    computation (those tensors are unusable afterwards, as after ``jax.jit``'s donation).
    ``autograd``: the backward is ``jax.vjp`` of ``fn`` (a ``jax.custom_vjp`` of yours is
    used as JAX uses it); ``False`` leaves the op without one. ``register_autograd`` on the
    returned op replaces it.
    """
    if fn is None:
        return lambda f: jax_op(name, f, donate_argnums=donate_argnums, autograd=autograd)
    if "::" not in name:
        raise ValueError(f"jax_op: name must be 'namespace::name', got {name!r}")
    sig = _Signature(name, fn)
    positions = (donate_argnums,) if isinstance(donate_argnums, int) else tuple(donate_argnums or ())
    for i in positions:
        if not 0 <= i < sig.count or not sig.types[i].startswith("Tensor"):
            raise ValueError(f"jax_op {name!r}: donate_argnums {i} is not a positional array argument")
    lowering = sig.lowering()
    op_def = _define(name, sig.schema, lowering, tuple(sig.names[i] for i in positions))
    if autograd and sig.returns:
        _register_vjp(op_def, sig, lowering)
    return op_def
