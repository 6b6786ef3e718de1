"""fbgemm's table-batched embeddings (TBE) on tpu: the kernels TorchRec's fused and dense
embedding modules, sharded or not, look rows up with.

TorchRec builds its TBEs on tpu as it does on MTIA: ``EmbeddingLocation.HOST`` and the CPU
code path of ``SplitTableBatchedEmbeddingBagsCodegen``, with every tensor on tpu. Here:

- the lookups (``split_embedding_codegen_lookup_<optimizer>_function_pt2`` for the fused
  optimizers ``sgd``, ``adagrad`` and ``rowwise_adagrad``; ``dense_embedding_codegen_lookup_function``
  for the dense kernel): their forward, and a backward that applies the optimizer to the rows
  the batch touched (fused) or returns the weights' gradient (dense), as fbgemm's do;
- ``bounds_check_indices``: an id outside its table raises in ``FATAL`` mode, and is looked up
  as row 0 with a warning in ``WARNING`` mode, as fbgemm's CPU kernel does;
- ``get_infos_metadata``: how fbgemm packs a (table, sample) pair into an int (a host
  computation on two ints).

The math is ``ops.fbgemm_tbe``'s; each piece runs as one JAX program (``pallas.jax_op``)."""

from __future__ import annotations

import dataclasses
import functools
import warnings
from typing import Any

import jax
import torch

from ..ops import fbgemm_tbe as tbe

A = jax.Array  # (the programs' annotations)

#: fbgemm's ``SparseType`` ints -> the output dtypes a lookup gives
OUTPUT_DTYPES = {0: torch.float32, 1: torch.float16, 5: torch.bfloat16}
#: fbgemm's ``BoundsCheckMode``
FATAL, WARNING, IGNORE, NO_CHECK = 0, 1, 2, 3
#: the fused optimizers, by the name in fbgemm's op
OPTIMIZERS = ("sgd", "adagrad", "rowwise_adagrad")
#: the names of the lookups' ``aux_bool`` and ``aux_float`` entries, in fbgemm's invokers' order
AUX_BOOL = (
    "is_experimental_tbe",
    "use_uniq_cache_locations_bwd",
    "use_homogeneous_placements",
    "apply_global_weight_decay",
    "gradient_clipping",
    "stochastic_rounding",
    "mixed_D",
)
AUX_FLOAT = ("gwd_lower_bound", "max_gradient")
#: the names of each optimizer's ``optim_float`` and ``optim_int`` entries (fbgemm's invokers')
OPTIM_SETTINGS = {
    "sgd": ((), ()),
    "adagrad": (("eps",), ()),
    "rowwise_adagrad": (("eps", "weight_decay", "max_norm"), ("weight_decay_mode",)),
}


@dataclasses.dataclass(frozen=True)
class Lookup:
    """One lookup's tensors (the TBE's flat layout) and statics."""

    weights: torch.Tensor
    weights_offsets: torch.Tensor
    D_offsets: torch.Tensor
    indices: torch.Tensor
    offsets: torch.Tensor
    indice_weights: torch.Tensor | None
    feature_requires_grad: torch.Tensor | None
    total_D: int
    max_D: int
    pooling_mode: int
    output_dtype: torch.dtype

    def layout(self) -> list:
        """``ops.fbgemm_tbe.Layout``'s tensors, in its order."""
        return [self.weights_offsets, self.D_offsets, self.indices, self.offsets]


@dataclasses.dataclass(frozen=True)
class Optimizer:
    """A fused optimizer's state and settings (``name`` None: the dense kernel, no update)."""

    name: str | None
    learning_rate: torch.Tensor | None = None
    momentum: torch.Tensor | None = None
    momentum_offsets: torch.Tensor | None = None
    gradient_clipping: bool = False
    max_gradient: float = 1.0
    settings: dict = dataclasses.field(default_factory=dict)  # (eps, weight_decay, ...)


def tbe_forward(
    weights: A, layout: list[A], indice_weights: A | None, total_D: int, max_D: int, pooling_mode: int
) -> A:
    return tbe.forward(weights, tbe.Layout(*layout), indice_weights, total_D, max_D, pooling_mode)


def tbe_weight_grad(
    grad_output: A, weights: A, layout: list[A], indice_weights: A | None, max_D: int, pooling_mode: int,
    gradient_clipping: bool, max_gradient: float,
) -> A:  # fmt: skip
    r = tbe.rows(weights, tbe.Layout(*layout), max_D)
    clip = max_gradient if gradient_clipping else None
    return tbe.weight_gradient(
        weights, r, tbe.row_gradients(grad_output, r, indice_weights, pooling_mode, clip)
    )


def tbe_indice_weight_grad(
    grad_output: A, weights: A, layout: list[A], feature_requires_grad: A | None, max_D: int
) -> A:
    r = tbe.rows(weights, tbe.Layout(*layout), max_D)
    return tbe.indice_weight_gradient(grad_output, weights, r, feature_requires_grad)


def tbe_adagrad(
    weights: A, momentum: A, grad: A, layout: list[A], learning_rate: A, max_D: int, eps: float
) -> tuple[A, A]:
    r = tbe.rows(weights, tbe.Layout(*layout), max_D)
    return tbe.adagrad(weights, momentum, r, grad, learning_rate, eps)


def tbe_rowwise_adagrad(
    weights: A, momentum: A, momentum_offsets: A, grad: A, layout: list[A], learning_rate: A, max_D: int,
    eps: float, weight_decay: float, decay_mode: int,
) -> tuple[A, A]:  # fmt: skip
    r = tbe.rows(weights, tbe.Layout(*layout), max_D)
    return tbe.rowwise_adagrad(
        weights, momentum, momentum_offsets, r, grad, learning_rate, eps, weight_decay, decay_mode
    )


def tbe_bounds_check(rows_per_table: A, indices: A, offsets: A) -> tuple[A, A, A]:
    return tbe.bounds_checked(rows_per_table, indices, offsets)


#: the JAX programs, defined as ``torch.ops.tpu_fbgemm`` ops at the first lookup
PROGRAMS = (
    tbe_forward,
    tbe_weight_grad,
    tbe_indice_weight_grad,
    tbe_adagrad,
    tbe_rowwise_adagrad,
    tbe_bounds_check,
)


@functools.cache
def _programs() -> None:
    from ..pallas import jax_op

    for program in PROGRAMS:
        jax_op(f"tpu_fbgemm::{program.__name__}", program, autograd=False)


def _op(name: str):
    _programs()
    return getattr(torch.ops.tpu_fbgemm, name)


def _flat(what: str, tensors: list) -> tuple[torch.Tensor, torch.Tensor]:
    """The one flat tensor and its per-feature offsets in fbgemm's list for ``what`` (the host
    layout ``[host, placements, offsets]`` or the device one ``[dev, uvm, placements, offsets,
    (cache)]``); uvm and cache placements have no tpu form."""
    if len(tensors) == 3:
        return tensors[0], tensors[2]
    dev, uvm, _, offsets, *cache = tensors
    if uvm.numel() or (cache and cache[0] is not None and cache[0].numel()):
        raise NotImplementedError(
            f"fbgemm TBE on tpu: {what} in UVM or an LXU cache (EmbeddingLocation.MANAGED / "
            "MANAGED_CACHING); tpu keeps tables in device memory (EmbeddingLocation.DEVICE or HOST)"
        )
    return dev, offsets


def _lookup(args: dict, weights: torch.Tensor, weights_offsets: torch.Tensor) -> Lookup:
    if args.get("B_offsets") is not None or args.get("vbe_output") is not None or args.get("max_B", -1) > 0:
        raise NotImplementedError("fbgemm TBE on tpu: variable batch sizes per feature (VBE)")
    if args["output_dtype"] not in OUTPUT_DTYPES:
        raise NotImplementedError(f"fbgemm TBE on tpu: output SparseType {args['output_dtype']}")
    return Lookup(
        weights=weights,
        weights_offsets=weights_offsets,
        D_offsets=args["D_offsets"],
        indices=args["indices"],
        offsets=args["offsets"],
        indice_weights=args["indice_weights"],
        feature_requires_grad=args["feature_requires_grad"],
        total_D=int(args["total_D"]),
        max_D=int(args["max_D"]),
        pooling_mode=int(args["pooling_mode"]),
        output_dtype=OUTPUT_DTYPES[args["output_dtype"]],
    )


def _weight_grad(grad_output: torch.Tensor, lookup: Lookup, optimizer: Optimizer) -> torch.Tensor:
    return _op("tbe_weight_grad")(
        grad_output.contiguous(),
        lookup.weights,
        lookup.layout(),
        lookup.indice_weights,
        lookup.max_D,
        lookup.pooling_mode,
        optimizer.gradient_clipping,
        float(optimizer.max_gradient),
    )


def _apply(grad: torch.Tensor, lookup: Lookup, optimizer: Optimizer) -> None:
    """The fused optimizer's step on the rows ``grad`` (the summed gradient) touches, in place."""
    weights, lr = lookup.weights, optimizer.learning_rate.to(lookup.weights.device)
    if optimizer.name == "sgd":
        weights.sub_((grad * lr).to(weights.dtype))
        return
    m, settings = optimizer.momentum, optimizer.settings
    if optimizer.name == "adagrad":
        new_w, new_m = _op("tbe_adagrad")(
            weights, m, grad, lookup.layout(), lr, lookup.max_D, settings["eps"]
        )
    else:
        new_w, new_m = _op("tbe_rowwise_adagrad")(
            weights, m, optimizer.momentum_offsets, grad, lookup.layout(), lr, lookup.max_D,
            settings["eps"], settings["weight_decay"], settings["weight_decay_mode"],
        )  # fmt: skip
    weights.copy_(new_w)
    m.copy_(new_m)


class _LookupFunction(torch.autograd.Function):
    """The lookup with fbgemm's backward: the dense weights' gradient, or the fused step (and
    the per-sample weights' gradient where they require it)."""

    @staticmethod
    def forward(ctx, weights, indice_weights, lookup: Lookup, optimizer: Optimizer):
        ctx.lookup, ctx.optimizer = lookup, optimizer
        out = _op("tbe_forward")(
            lookup.weights,
            lookup.layout(),
            lookup.indice_weights,
            lookup.total_D,
            lookup.max_D,
            lookup.pooling_mode,
        )
        return out.to(lookup.output_dtype)

    @staticmethod
    def backward(ctx, grad_output):
        lookup, optimizer = ctx.lookup, ctx.optimizer
        indice_grad = None
        if ctx.needs_input_grad[1]:
            indice_grad = _op("tbe_indice_weight_grad")(
                grad_output.contiguous(),
                lookup.weights,
                lookup.layout(),
                lookup.feature_requires_grad,
                lookup.max_D,
            )
        grad = _weight_grad(grad_output, lookup, optimizer)
        if optimizer.name is None:
            return grad.to(lookup.weights.dtype), indice_grad, None, None
        with torch.no_grad():
            _apply(grad, lookup, optimizer)
        return None, indice_grad, None, None


def _bound(op, args: tuple, kwargs: dict) -> dict:
    """The call's arguments by the schema's names."""
    names = [a.name for a in op._schema.arguments]
    bound = {a.name: a.default_value for a in op._schema.arguments if a.has_default_value()}
    bound.update(zip(names, args))
    bound.update(kwargs)
    return bound


def _fused_lookup(name: str, op):
    def kernel(*args, **kwargs):
        a = _bound(op, args, kwargs)
        weights, weights_offsets = _flat("the weights", a["weights"])
        momentum = momentum_offsets = None
        if "momentum1" in a:
            momentum, momentum_offsets = _flat("the optimizer state", a["momentum1"])
        aux = {**dict(zip(AUX_BOOL, a["aux_bool"])), **dict(zip(AUX_FLOAT, a["aux_float"]))}
        if aux.get("apply_global_weight_decay"):
            raise NotImplementedError("fbgemm TBE on tpu: global weight decay")
        optimizer = Optimizer(
            name=name,
            learning_rate=a["learning_rate_tensor"],
            momentum=momentum,
            momentum_offsets=momentum_offsets,
            gradient_clipping=bool(aux.get("gradient_clipping", False)),
            max_gradient=float(aux.get("max_gradient", 1.0)),
            settings=_settings(name, a),
        )
        lookup = _lookup(a, weights, weights_offsets)
        return _LookupFunction.apply(
            a["placeholder_autograd_tensor"], lookup.indice_weights, lookup, optimizer
        )

    return kernel


def _settings(name: str, args: dict) -> dict:
    """The optimizer's settings by name; the ones tpu's update does not take refused here, at
    the lookup, rather than in its backward."""
    floats, ints = OPTIM_SETTINGS[name]
    settings = {
        **dict(zip(floats, args.get("optim_float") or ())),
        **dict(zip(ints, args.get("optim_int") or ())),
    }
    if settings.get("max_norm", 0) > 0:
        raise NotImplementedError(f"fbgemm TBE on tpu: {name} with max_norm > 0")
    if settings.get("weight_decay_mode", 0) not in (0, 1, 2):
        raise NotImplementedError(
            f"fbgemm TBE on tpu: {name}'s weight_decay_mode {settings['weight_decay_mode']}"
        )
    return settings


def _dense_lookup(op):
    def kernel(*args, **kwargs):
        a = _bound(op, args, kwargs)
        lookup = _lookup(a, a["dev_weights"], a["weights_offsets"])
        return _LookupFunction.apply(lookup.weights, lookup.indice_weights, lookup, Optimizer(None))

    return kernel


def bounds_check_indices(
    rows_per_table, indices, offsets, bounds_check_mode, warning, *rest, **kwargs
) -> None:
    """fbgemm's input check: every id inside its table, the offsets non-decreasing and within the
    indices; ``FATAL`` raises, ``WARNING`` and ``IGNORE`` look bad ids up as row 0 and clamp the
    offsets (``WARNING`` also warns and counts them in ``warning``)."""
    if bounds_check_mode == NO_CHECK:
        return
    if len(rest) > 1 and rest[1] is not None or kwargs.get("B_offsets") is not None:
        raise NotImplementedError("fbgemm::bounds_check_indices on tpu: variable batch sizes (B_offsets)")
    bad, fixed_indices, fixed_offsets = _op("tbe_bounds_check")(
        rows_per_table.to(indices.device), indices, offsets
    )
    count = int(bad.sum()) if bounds_check_mode in (FATAL, WARNING) else 0
    if count:
        message = _bounds_message(bad, rows_per_table, indices, offsets)
        if bounds_check_mode == FATAL:
            raise RuntimeError(message)
        warnings.warn(message + " Setting idx to zero.", stacklevel=2)
        warning.add_(count)
    indices.copy_(fixed_indices)
    offsets.copy_(fixed_offsets)


def _bounds_message(bad, rows_per_table, indices, offsets) -> str:
    """fbgemm's words for the first bad id (its sample, feature, place in the bag, table size)."""
    host_bad, host_offsets = bad.cpu(), offsets.cpu()
    if not bool(host_bad[: indices.numel()].any()):
        shown = host_offsets.tolist()[:32]
        return f"EmbeddingBoundsCheck: offsets out of bounds for {indices.numel()} indices: {shown}"
    i = int(host_bad[: indices.numel()].nonzero()[0])
    bag = int(torch.searchsorted(host_offsets, torch.tensor(i), right=True)) - 1
    batch = (host_offsets.numel() - 1) // rows_per_table.numel()
    t = bag // batch
    return (
        f"EmbeddingBoundsCheck: (at least one) Out of bounds access for batch: {bag % batch}, "
        f"table: {t}, bag element: {i - int(host_offsets[bag])}, idx: {int(indices[i])}, "
        f"num_rows: {int(rows_per_table[t])}."
    )


def get_infos_metadata(unused, B: int, T: int):
    """How fbgemm packs (table, sample) into an int: two ints from two ints (fbgemm's own
    function, on a host placeholder)."""
    return torch.ops.fbgemm.get_infos_metadata(torch.empty(0), B, T)


def register(library: Any) -> None:
    """The TBE kernels, on the fbgemm library ``integrations.fbgemm`` registers into."""
    fbgemm = torch.ops.fbgemm
    for name in OPTIMIZERS:
        packet = getattr(fbgemm, f"split_embedding_codegen_lookup_{name}_function_pt2", None)
        if packet is not None:
            library.impl(packet.default, _fused_lookup(name, packet.default), "AutogradPrivateUse1")
    if hasattr(fbgemm, "dense_embedding_codegen_lookup_function"):
        packet = fbgemm.dense_embedding_codegen_lookup_function.default
        library.impl(packet, _dense_lookup(packet), "AutogradPrivateUse1")
    if hasattr(fbgemm, "bounds_check_indices"):
        library.impl(fbgemm.bounds_check_indices.default, bounds_check_indices, "PrivateUse1")
    if hasattr(fbgemm, "get_infos_metadata"):
        library.impl(fbgemm.get_infos_metadata.default, get_infos_metadata, "PrivateUse1")
