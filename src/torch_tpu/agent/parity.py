"""Per-layer numerical parity: run a model on tpu and on CPU with forward hooks and name the first
module whose output on tpu is further from the float64 answer than CPU's own float32 is.

The tolerance of each module's output comes from the float64 reference, not from a fixed
epsilon: CPU's float32 error against float64 measures how hard that output is to compute in
float32, and tpu may be off by :data:`SLACK` times that (plus :data:`FLOOR` of the output's
scale, for outputs float32 computes exactly). Modules are compared in the order they finish
(a child before its parent, a layer before the next), so the first divergent one is where the
error enters: the modules after it inherit it.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable
from typing import Any

import torch

#: how many times CPU float32's error against float64 tpu may be off
SLACK = 8.0
#: the error allowed for an output float32 computes exactly, relative to its largest value
FLOOR = 1e-6


@dataclasses.dataclass(frozen=True)
class LayerError:
    """One module's output on a backend against float64: the largest absolute difference."""

    module: str
    kind: str
    cpu_error: float
    tpu_error: float
    tolerance: float
    scale: float

    @property
    def diverges(self) -> bool:
        return self.tpu_error > self.tolerance


def _tensors(value: Any) -> list[torch.Tensor]:
    return [v for v in torch.utils._pytree.tree_leaves(value) if isinstance(v, torch.Tensor)]


def _record_outputs(model: torch.nn.Module, inputs: tuple) -> dict[str, list[torch.Tensor]]:
    """Every module's outputs (on CPU, float64) in the order the modules finished."""
    seen: dict[str, list[torch.Tensor]] = {}

    def keeper(name: str) -> Callable:
        def keep(module: torch.nn.Module, args: tuple, out: Any) -> None:
            if name not in seen:  # (a module called twice: its first call)
                seen[name] = [
                    t.detach().to("cpu", torch.float64) for t in _tensors(out) if t.is_floating_point()
                ]

        return keep

    handles = [m.register_forward_hook(keeper(name or "(model)")) for name, m in model.named_modules()]
    try:
        with torch.no_grad():
            model(*inputs)
    finally:
        for handle in handles:
            handle.remove()
    return seen


def _largest_difference(outputs: list[torch.Tensor], reference: list[torch.Tensor]) -> float:
    return max((float((o - r).abs().max()) for o, r in zip(outputs, reference) if o.numel()), default=0.0)


def _scale(reference: list[torch.Tensor]) -> float:
    return max((float(r.abs().max()) for r in reference if r.numel()), default=0.0)


def compare(model: torch.nn.Module, inputs: tuple, device: str = "tpu") -> list[LayerError]:
    """Each floating-point module output's error on CPU float32 and on ``device`` against float64,
    in the order the modules finished."""
    reference = _record_outputs(copy.deepcopy(model).double(), tuple(_cast(x, torch.float64) for x in inputs))
    cpu = _record_outputs(copy.deepcopy(model).float(), tuple(_cast(x, torch.float32) for x in inputs))
    moved = copy.deepcopy(model).float().to(device)
    tpu = _record_outputs(moved, tuple(_cast(x, torch.float32).to(device) for x in inputs))
    kinds = {name or "(model)": type(m).__name__ for name, m in model.named_modules()}
    out = []
    for name, ref in reference.items():
        if name not in tpu or not ref:
            continue
        cpu_error, tpu_error, scale = (
            _largest_difference(cpu[name], ref),
            _largest_difference(tpu[name], ref),
            _scale(ref),
        )
        tolerance = SLACK * cpu_error + FLOOR * max(scale, 1.0)
        out.append(LayerError(name, kinds[name], cpu_error, tpu_error, tolerance, scale))
    return out


def _cast(x: Any, dtype: torch.dtype) -> Any:
    return x.to(dtype) if isinstance(x, torch.Tensor) and x.is_floating_point() else x


def layer_parity(make: Callable[[], tuple], device: str = "tpu") -> dict:
    """``make()`` gives ``(model, inputs)`` (a CPU module and a tensor or tuple of tensors).
    The report: whether every module agrees, the first divergent one with its numbers, and every
    module's errors."""
    model, inputs = make()
    inputs = inputs if isinstance(inputs, tuple) else (inputs,)
    errors = compare(model, inputs, device)
    first = next((e for e in errors if e.diverges), None)
    return {
        "agrees": first is None,
        "first_divergent": None if first is None else _row(first),
        "modules": [_row(e) for e in errors],
        "rule": f"tpu error <= {SLACK} x CPU float32's error against float64 + {FLOOR} x max(|output|, 1)",
    }


def _row(error: LayerError) -> dict:
    return dataclasses.asdict(error) | {"diverges": error.diverges}
