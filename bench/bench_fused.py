"""One GPT training step in fused eager next to strict eager, PyTorch CPU and hand-written JAX.

The step is forward, cross-entropy loss, backward, ``AdamW.step()`` and ``zero_grad()`` of the
demo GPT (``torch_tpu.demo.model.GPT``), run four ways on the same weights and batch:

- **torch cpu**: PyTorch CPU eager;
- **tpu strict**: torch_tpu's default mode, every op dispatched on its own;
- **tpu fused**: ``torch_tpu.eager_mode("fused")``, ops recorded and run as compiled graphs at the
  step's sync points (end of ``backward()``, end of ``optimizer.step()``);
- **jax.jit**: the same model and step written by hand in JAX (``_jax_gpt.py``): one jitted
  function with ``jax.value_and_grad`` and a PyTorch-semantics AdamW update, buffers donated.
  Before timing, the script checks it computes the torch CPU loss and AdamW update.

Warm times are medians of interleaved rounds (``bench_ops.compare``), after warm-up steps; the
fused steps must then hit the graph cache every time. Cold times are each contender's first two
steps in a fresh process with the persistent compilation cache off (on tpu: compiling). PyTorch
CPU is sensitive to other load on the machine, so check the load average printed first. Usage::

    python bench/bench_fused.py              # check, cold and warm numbers (about a minute)
    python bench/bench_fused.py --quick      # fewer rounds, no cold numbers (smoke run)
    python bench/bench_fused.py --markdown   # the table as Markdown, for the docs
    python bench/bench_fused.py --check      # only check the JAX step against torch CPU
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable

import _docs
import _jax_gpt
import jax
import torch
from bench_ops import compare, no_sync

import torch_tpu
from torch_tpu.demo.model import GPT, GPTConfig

CONFIG = GPTConfig(vocab_size=96, block_size=64, n_layer=2, n_head=4, n_embd=128)
BATCH = 16
ADAMW = _jax_gpt.AdamW(lr=1e-3, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.01)
#: fused steps run before timing: the first steps compile (the optimizer state is created on
#: the first one, so the second step's graphs differ from the first's)
WARMUP_STEPS = 3
#: the targets the fused mode is held to
STRICT_OVER_FUSED_TARGET, FUSED_OVER_JAX_TARGET = 2.0, 1.3
LOSS_TOLERANCE, UPDATE_TOLERANCE = 1e-5, 1e-4

LABELS = {
    "cpu": "torch cpu eager",
    "strict": "tpu strict eager",
    "fused": "tpu fused eager",
    "jax": "jax.jit (hand-written)",
}
Contender = tuple[Callable[[], object], Callable[[], None]]


def _model_and_batch(
    config: GPTConfig = CONFIG, batch: int = BATCH
) -> tuple[GPT, torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    model = GPT(config)
    idx = torch.randint(0, config.vocab_size, (batch, config.block_size))
    targets = torch.randint(0, config.vocab_size, (batch, config.block_size))
    return model, idx, targets


def _torch_adamw(params, **options) -> torch.optim.AdamW:
    return torch.optim.AdamW(
        params,
        lr=ADAMW.lr,
        betas=(ADAMW.beta1, ADAMW.beta2),
        eps=ADAMW.eps,
        weight_decay=ADAMW.weight_decay,
        **options,
    )


def _torch_step(
    model: GPT,
    device: str,
    idx: torch.Tensor,
    targets: torch.Tensor,
    mode: str | None = None,
    **optimizer_options,
) -> Callable[[], torch.Tensor]:
    """A training step of a copy of ``model`` on ``device`` (in eager ``mode`` on tpu)."""
    replica = copy.deepcopy(model).to(device)
    optimizer = _torch_adamw(replica.parameters(), **optimizer_options)
    idx, targets = idx.to(device), targets.to(device)

    def step() -> torch.Tensor:
        _, loss = replica(idx, targets)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss

    if mode is None:
        return step

    def step_in_mode() -> torch.Tensor:
        with torch_tpu.eager_mode(mode):
            return step()

    return step_in_mode


class _JaxStep:
    """The hand-written JAX step holding its (donated, so replaced every call) state."""

    def __init__(self, model: GPT, idx: torch.Tensor, targets: torch.Tensor):
        self.params = _jax_gpt.params_from_torch(model)
        self.opt_state = _jax_gpt.init_adamw(self.params)
        self.idx, self.targets = jax.numpy.asarray(idx.numpy()), jax.numpy.asarray(targets.numpy())
        self.step_fn = _jax_gpt.make_train_step(CONFIG.n_head, ADAMW)
        self.loss: jax.Array | None = None

    def __call__(self) -> jax.Array:
        self.params, self.opt_state, self.loss = self.step_fn(
            self.params, self.opt_state, self.idx, self.targets
        )
        return self.loss

    def sync(self) -> None:
        jax.block_until_ready((self.params, self.opt_state, self.loss))


def _contenders(model: GPT, idx: torch.Tensor, targets: torch.Tensor) -> dict[str, Contender]:
    jax_step = _JaxStep(model, idx, targets)
    return {
        "cpu": (_torch_step(model, "cpu", idx, targets), no_sync),
        "strict": (_torch_step(model, "tpu", idx, targets, "strict"), torch.tpu.synchronize),
        "fused": (_torch_step(model, "tpu", idx, targets, "fused"), torch.tpu.synchronize),
        "jax": (jax_step, jax_step.sync),
    }


def check_same_model() -> dict[str, float]:
    """Assert the JAX step is torch CPU's step for the same weights and batch: the same loss,
    gradients and, from the same gradients, AdamW update. Returns those relative differences and
    (not asserted) the whole jitted step's, where gradients differing by float32 rounding go
    through Adam's first step, ``g / (|g| + eps)``: that amplifies them wherever ``|g|`` is near
    ``eps``, and the attention key bias's gradient is zero in exact arithmetic (softmax ignores a
    shift shared by a row of scores), so pure rounding noise on both sides."""
    model, idx, targets = _model_and_batch()
    params = _jax_gpt.params_from_torch(model)
    jax_idx, jax_targets = jax.numpy.asarray(idx.numpy()), jax.numpy.asarray(targets.numpy())
    loss_and_grads = jax.jit(jax.value_and_grad(_jax_gpt.loss_fn), static_argnums=3)
    jax_loss, jax_grads = loss_and_grads(params, jax_idx, jax_targets, CONFIG.n_head)

    cpu_replica = copy.deepcopy(model)
    _, cpu_loss = cpu_replica(idx, targets)
    cpu_loss.backward()
    gradients = copy.deepcopy(cpu_replica)
    for parameter, source in zip(gradients.parameters(), cpu_replica.parameters()):
        parameter.data = source.grad
    cpu_grads = _jax_gpt.params_from_torch(gradients)
    _torch_adamw(cpu_replica.parameters()).step()
    cpu_updated = _jax_gpt.params_from_torch(cpu_replica)

    update = jax.jit(_jax_gpt.adamw_update, static_argnums=3)
    updated_from_cpu_grads, _ = update(params, cpu_grads, _jax_gpt.init_adamw(params), ADAMW)
    jax_step = _JaxStep(model, idx, targets)
    jax_step()
    differences = {
        "loss": abs(float(jax_loss) - cpu_loss.item()) / abs(cpu_loss.item()),
        "gradients": _jax_gpt.max_relative_difference(jax_grads, cpu_grads),
        "AdamW update": _jax_gpt.max_relative_difference(updated_from_cpu_grads, cpu_updated),
        "whole step (not asserted)": _jax_gpt.max_relative_difference(jax_step.params, cpu_updated),
    }
    for name, tolerance in (
        ("loss", LOSS_TOLERANCE),
        ("gradients", UPDATE_TOLERANCE),
        ("AdamW update", UPDATE_TOLERANCE),
    ):
        assert differences[name] < tolerance, (
            f"JAX {name} differs from torch CPU's by {differences[name]:.2e} (>= {tolerance:g})"
        )
    return differences


def _first_steps(name: str) -> dict:
    """(Run in a fresh process.) The first and second steps of contender ``name``, each with its
    sync (fused compiles on both: the optimizer state the first step creates changes the
    graphs), and the fused graph cache counters after them."""
    model, idx, targets = _model_and_batch()
    torch.tpu.reset_compilation_cache_stats()
    fn, sync = _contenders(model, idx, targets)[name]
    seconds = []
    for _ in range(2):
        start = time.perf_counter()
        fn()
        sync()
        seconds.append(time.perf_counter() - start)
    return {"first": seconds[0], "second": seconds[1], **torch.tpu.compilation_cache_stats()}


def cold_times() -> dict[str, dict]:
    """Each contender's first two steps, each in a fresh process without the persistent cache."""
    environment = dict(os.environ, TORCH_TPU_CACHE_DIR="0")
    results = {}
    for name in LABELS:
        output = subprocess.run(
            [sys.executable, __file__, "--first-steps", name],
            env=environment,
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        results[name] = json.loads(output.splitlines()[-1])
    return results


@dataclasses.dataclass
class Warm:
    seconds: dict[str, float]
    fused_steps: int
    fused_stats: dict

    @property
    def hit_rate(self) -> float:
        return self.fused_stats["hits"] / max(self.fused_stats["requests"], 1)

    @property
    def graphs_per_step(self) -> float:
        return self.fused_stats["graphs_run"] / max(self.fused_steps, 1)

    @property
    def ops_per_step(self) -> float:
        return self.fused_stats["ops_run"] / max(self.fused_steps, 1)


def warm_times(calls: int, rounds: int) -> Warm:
    model, idx, targets = _model_and_batch()
    contenders = _contenders(model, idx, targets)
    for fn, sync in contenders.values():
        for _ in range(WARMUP_STEPS):
            fn()
        sync()
    fused_step, fused_sync = contenders["fused"]
    fused_steps = [0]

    def counted_fused_step():
        fused_steps[0] += 1
        return fused_step()

    contenders["fused"] = (counted_fused_step, fused_sync)
    torch.tpu.reset_compilation_cache_stats()
    seconds = compare(contenders, calls, rounds)
    return Warm(seconds, fused_steps[0], torch.tpu.compilation_cache_stats())


def _verdict(value: float, target: float, at_least: bool) -> str:
    met = value >= target if at_least else value <= target
    return f"target {'>=' if at_least else '<='} {target:g}x: {'met' if met else 'NOT met'}"


def _summary(warm: Warm, cold: dict | None) -> list[tuple[str, str]]:
    s = warm.seconds
    lines = [
        (
            "strict / fused (warm)",
            f"{s['strict'] / s['fused']:.2f}x  "
            f"({_verdict(s['strict'] / s['fused'], STRICT_OVER_FUSED_TARGET, True)})",
        ),
        (
            "fused / jax.jit (warm)",
            f"{s['fused'] / s['jax']:.2f}x  "
            f"({_verdict(s['fused'] / s['jax'], FUSED_OVER_JAX_TARGET, False)})",
        ),
        ("fused / torch cpu (warm)", f"{s['fused'] / s['cpu']:.2f}x"),
        (
            "fused graph cache, timed steps",
            f"{warm.hit_rate:.1%} hits ({warm.fused_stats['hits']}/"
            f"{warm.fused_stats['requests']} over {warm.fused_steps} steps), "
            f"{warm.graphs_per_step:g} graphs and {warm.ops_per_step:g} ops per step, "
            f"syncs: {warm.fused_stats['sync_reasons']}",
        ),
    ]
    if cold:
        lines.append(
            (
                "fused / strict (cold, 1st step)",
                f"{cold['fused']['first'] / cold['strict']['first']:.2f}x  (fused compiled "
                f"{cold['fused']['misses']} graphs in {cold['fused']['compile_seconds']:.2f}"
                f" s over its first 2 steps)",
            )
        )
    return lines


def text_table(warm: Warm, cold: dict | None) -> str:
    header = (
        f"{'training step':24s} {'1st step':>10s} {'2nd step':>10s} {'warm (median)':>14s}"
        f" {'vs jax.jit':>11s}"
    )
    lines = [header, "-" * len(header)]
    for name, label in LABELS.items():
        first = (
            f"{cold[name]['first']:8.3f} s {cold[name]['second']:8.3f} s"
            if cold
            else f"{'-':>10s} {'-':>10s}"
        )
        lines.append(
            f"{label:24s} {first} {warm.seconds[name] * 1e3:11.2f} ms "
            f"{warm.seconds[name] / warm.seconds['jax']:10.2f}x"
        )
    lines.append("")
    lines += [f"{name + ':':33s} {value}" for name, value in _summary(warm, cold)]
    return "\n".join(lines)


def markdown_table(warm: Warm, cold: dict | None) -> str:
    lines = [
        "| training step | 1st step (cold) | 2nd step | warm (median) | time / jax.jit |",
        "|---|---|---|---|---|",
    ]
    for name, label in LABELS.items():
        first = f"{cold[name]['first']:.3f} s | {cold[name]['second']:.3f} s" if cold else "- | -"
        lines.append(
            f"| {label} | {first} | {warm.seconds[name] * 1e3:.2f} ms | "
            f"{warm.seconds[name] / warm.seconds['jax']:.2f}x |"
        )
    lines += ["", "| | |", "|---|---|"]
    lines += [f"| {name} | {value} |" for name, value in _summary(warm, cold)]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds, no cold numbers")
    parser.add_argument("--markdown", action="store_true", help="print a Markdown table")
    parser.add_argument("--check", action="store_true", help="only check the JAX step against torch CPU")
    parser.add_argument("--first-steps", choices=LABELS, help=argparse.SUPPRESS)
    _docs.add_flag(parser)
    args = parser.parse_args(argv)
    if args.first_steps:
        print(json.dumps(_first_steps(args.first_steps)))
        return
    print(
        f"device: {torch.tpu.get_device_name()}  (torch {torch.__version__}, "
        f"jax {jax.__version__}, {torch.get_num_threads()} CPU threads, load average "
        f"{os.getloadavg()[0]:.1f} at start)"
    )
    differences = check_same_model()
    print(
        "JAX step vs torch CPU step, max relative differences: "
        + ", ".join(f"{name} {value:.1e}" for name, value in differences.items())
        + f" (asserted: loss < {LOSS_TOLERANCE:g}, others < {UPDATE_TOLERANCE:g})"
    )
    if args.check:
        return
    rounds, calls = (3, 3) if args.quick else (7, 5)
    print(
        f"model: GPT, {sum(p.numel() for p in GPT(CONFIG).parameters()):,} parameters: "
        + ", ".join(f"{k}={v}" for k, v in dataclasses.asdict(CONFIG).items())
        + f"; batch {BATCH} x {CONFIG.block_size} tokens; step = forward, cross-entropy, "
        f"backward, AdamW, zero_grad; warm = median of {rounds} interleaved rounds of "
        f"{calls} steps after {WARMUP_STEPS} warm-up steps; cold = first steps in a fresh "
        f"process, no persistent cache\n",
        flush=True,
    )
    cold = None if args.quick else cold_times()
    warm = warm_times(calls, rounds)
    with _docs.section("fused", args):
        print(markdown_table(warm, cold) if args.markdown else text_table(warm, cold))
    print(f"\nload average {os.getloadavg()[0]:.1f} at end")
    assert warm.hit_rate == 1.0, f"fused steps missed the graph cache: {warm.fused_stats}"


if __name__ == "__main__":
    main()
