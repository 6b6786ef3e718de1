"""A schema's arguments as the dispatcher sees them: their kinds, defaults and a binder turning
a kernel call into schema-ordered values."""

from __future__ import annotations

from typing import Any

import torch

#: The kinds of schema arguments, by how the dispatcher converts them.
TENSOR, TENSOR_LIST, INDICES, SCALAR, SCALAR_LIST, STATIC, DTYPE, GENERATOR, HOST_SCALARS = range(9)
#: An argument without a schema default.
NO_DEFAULT = object()

#: Schema defaults spell a ScalarType as its enum ordinal (randperm's ``dtype=4`` is torch.long).
_SCALAR_TYPE_ORDINALS = {
    0: torch.uint8,
    1: torch.int8,
    2: torch.int16,
    3: torch.int32,
    4: torch.int64,
    5: torch.float16,
    6: torch.float32,
    7: torch.float64,
    9: torch.complex64,
    10: torch.complex128,
    11: torch.bool,
    15: torch.bfloat16,
    27: torch.uint16,
    28: torch.uint32,
    29: torch.uint64,
}


def kind_of(arg: torch._C.Argument) -> int:
    """The kind of a schema argument (``TENSOR`` ... ``HOST_SCALARS``)."""
    text = str(arg.real_type)  # .type spells ScalarType as "int"
    if text == "Tensor" and arg.name == "scalars":  # _foreach_*.Tensor's, one number per tensor
        return HOST_SCALARS
    if text in ("Tensor", "Optional[Tensor]"):
        return TENSOR
    if text == "List[Tensor]":
        return TENSOR_LIST
    if text == "List[Optional[Tensor]]":  # the indices of index / index_put
        return INDICES
    if text in ("number", "Optional[number]"):
        return SCALAR
    if text == "List[number]":  # the per-tensor scalars of _foreach ops
        return SCALAR_LIST
    if text in ("ScalarType", "Optional[ScalarType]"):
        return DTYPE
    if text == "Optional[Generator]":
        return GENERATOR
    return STATIC


def is_written(arg: torch._C.Argument) -> bool:
    return arg.alias_info is not None and arg.alias_info.is_write


def is_out(arg: torch._C.Argument) -> bool:
    return arg.kwarg_only and is_written(arg)


def holds_floats(arg: torch._C.Argument) -> bool:
    """Whether a static argument of this schema type may be or hold a float."""
    text = str(arg.real_type)
    return "float" in text or "number" in text


def default_of(arg: torch._C.Argument) -> Any:
    if not arg.has_default_value():
        return NO_DEFAULT
    value = arg.default_value
    if kind_of(arg) == DTYPE and isinstance(value, int):
        return _SCALAR_TYPE_ORDINALS[value]
    return value


def is_default(value: Any, default: Any) -> bool:
    """Whether an argument is at its schema default as the dispatcher compares them (IValue
    equality: of the same type)."""
    return value is default or (type(value) is type(default) and value == default)


def returns_shape(schema: torch._C.FunctionSchema) -> str:
    """ "one" tensor, a "list" (``Tensor[]``) or a "tuple"."""
    returns = schema.returns
    if len(returns) == 1:
        return "list" if str(returns[0].type) == "List[Tensor]" else "one"
    return "tuple"


class Binder:
    """Precomputed view of a schema: turns a Python-kernel call into schema-ordered values."""

    def __init__(self, schema: torch._C.FunctionSchema):
        args = [a for a in schema.arguments if not is_out(a)]
        self.names = [a.name for a in args]
        self.defaults = [default_of(a) for a in args]
        self.kinds = [kind_of(a) for a in args]
        self.outs = [a.name for a in schema.arguments if is_out(a)]

    def bind(self, args: tuple, kwargs: dict) -> list:
        values = list(args)
        if not kwargs:  # (the common call: positional arguments, the rest defaulted)
            values += self.defaults[len(args) :]
            return values
        for name, default in zip(self.names[len(args) :], self.defaults[len(args) :]):
            values.append(kwargs[name] if name in kwargs else default)
        return values

    def positional(self, args: tuple, kwargs: dict) -> tuple:
        """The call as one tuple of its arguments up to the last one not at its default (a
        keyword-only one too): what the C++ core hands the fast path (``BoxedPlannedKernel``),
        so that ``x.add(y, alpha=2)`` keeps plans as ``x.add(y)`` does."""
        values = self.bind(args, kwargs)
        used = len(values)
        while used and is_default(values[used - 1], self.defaults[used - 1]):
            used -= 1
        return tuple(values[:used])
