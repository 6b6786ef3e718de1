"""Trying the settings that change tpu's speed on the user's own model, and reporting the fastest
one whose answers are right, measured.

A setting is an eager mode (strict: a program per op; fused: ops recorded and run as graphs),
``torch.compile(backend="tpu")`` or not, and the float32 matmul precision. Training is right
where each step's loss is within the float64-derived tolerance of :mod:`.parity` (CPU's float32
error against float64, times ``SLACK``); generation where the tokens equal CPU's greedy ones.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import time
from collections.abc import Callable
from typing import Any

import torch

from .parity import FLOOR, SLACK


@dataclasses.dataclass(frozen=True)
class Setting:
    mode: str  # "strict" or "fused"
    compiled: bool
    precision: str  # torch.set_float32_matmul_precision's value

    @property
    def name(self) -> str:
        return f"{'compiled' if self.compiled else self.mode}, matmul precision {self.precision!r}"

    @contextlib.contextmanager
    def applied(self):
        import torch_tpu

        before = torch.get_float32_matmul_precision()
        torch.set_float32_matmul_precision(self.precision)
        try:
            with torch_tpu.eager_mode(self.mode):
                yield
        finally:
            torch.set_float32_matmul_precision(before)


TRAINING = tuple(
    Setting(mode, compiled, precision)
    for precision in ("highest", "high")
    for mode, compiled in (("strict", False), ("fused", False), ("strict", True))
)
GENERATION = tuple(Setting(mode, False, p) for p in ("highest", "high") for mode in ("strict", "fused"))


@dataclasses.dataclass(frozen=True)
class Trial:
    setting: str
    seconds: float
    right: bool
    detail: str


def _report(trials: list[Trial], unit: str, per: float) -> dict:
    right = [t for t in trials if t.right]
    best = min(right, key=lambda t: t.seconds) if right else None
    return {
        "best": None if best is None else best.setting,
        "trials": [dataclasses.asdict(t) | {unit: per / t.seconds if t.seconds else None} for t in trials],
    }


# ----------------------------------------------------------------------------- training
def _unpack_training(made: tuple) -> tuple[torch.nn.Module, tuple, Callable]:
    model, inputs, *rest = made
    inputs = inputs if isinstance(inputs, tuple) else (inputs,)
    loss = rest[0] if rest else (lambda out: out.float().pow(2).mean())
    return model, inputs, loss


def _train(model: torch.nn.Module, inputs: tuple, loss_fn: Callable, steps: int, device: str, compiled: bool):
    """The losses of ``steps`` SGD steps, and the seconds the steps after the first two took."""
    model = model.to(device)
    forward = torch.compile(model, backend="tpu") if compiled else model
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    inputs = tuple(x.to(device) for x in inputs)
    losses, started = [], 0.0
    for step in range(steps):
        if step == 2:
            if device == "tpu":
                torch.tpu.synchronize()
            started = time.perf_counter()
        loss = loss_fn(forward(*inputs))
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.detach())
    values = torch.stack(losses).to("cpu", torch.float64)  # (the one host read: waits for all)
    return values, time.perf_counter() - started


def tune_training(make: Callable[[], tuple], steps: int = 8) -> dict:
    """``make()`` gives ``(model, inputs)`` or ``(model, inputs, loss_fn)`` (CPU; the default loss
    is the output's mean square). Each setting trains a copy for ``steps`` SGD steps."""
    model, inputs, loss_fn = _unpack_training(make())
    cast = lambda dtype: tuple(x.to(dtype) if x.is_floating_point() else x for x in inputs)  # noqa: E731
    reference, _ = _train(copy.deepcopy(model).double(), cast(torch.float64), loss_fn, steps, "cpu", False)
    cpu, _ = _train(copy.deepcopy(model).float(), cast(torch.float32), loss_fn, steps, "cpu", False)
    tolerance = SLACK * (cpu - reference).abs() + FLOOR * reference.abs().clamp(min=1.0)
    trials = []
    for setting in TRAINING:
        with setting.applied():
            losses, seconds = _train(
                copy.deepcopy(model).float(), cast(torch.float32), loss_fn, steps, "tpu", setting.compiled
            )
        off = float(((losses - reference).abs() - tolerance).max())
        detail = "losses within tolerance" if off <= 0 else f"a loss is {off:.3g} beyond its tolerance"
        trials.append(Trial(setting.name, seconds / (steps - 2), off <= 0, detail))
    return _report(trials, "steps_per_second", 1.0)


# ----------------------------------------------------------------------------- generation
def _generate(model: Any, input_ids: torch.Tensor, new_tokens: int) -> tuple[torch.Tensor, float]:
    device = next(model.parameters()).device
    ids = input_ids.to(device)
    options = dict(max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False)
    model.generate(ids, **options)  # (compiles: not timed)
    started = time.perf_counter()
    out = model.generate(ids, **options).cpu()
    return out, time.perf_counter() - started


def tune_generation(make: Callable[[], tuple]) -> dict:
    """``make()`` gives ``(model, input_ids, max_new_tokens)``: a Hugging Face causal LM on CPU,
    a prompt batch. Each setting generates greedily; right where its tokens equal CPU's."""
    model, input_ids, new_tokens = make()
    expected, _ = _generate(copy.deepcopy(model).float(), input_ids, new_tokens)
    trials = []
    for setting in GENERATION:
        with setting.applied():
            tokens, seconds = _generate(copy.deepcopy(model).float().to("tpu"), input_ids, new_tokens)
        same = tokens.shape == expected.shape and bool((tokens == expected).all())
        detail = "tokens equal CPU's" if same else "tokens differ from CPU's greedy ones"
        trials.append(Trial(setting.name, seconds, same, detail))
    return _report(trials, "tokens_per_second", float(new_tokens * input_ids.shape[0]))
