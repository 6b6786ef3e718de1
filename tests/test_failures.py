"""Failures lose nothing: a fused graph that fails (out of memory, any XLA error) or is
interrupted leaves every tensor that had a value before it with that value, the process stays
usable, Ctrl-C is delivered, and running out of memory raises ``torch.OutOfMemoryError``."""

from __future__ import annotations

import copy
import gc
import io
import signal
import time

import pytest
import torch

import torch_tpu
from torch_tpu import execution
from torch_tpu.demo.model import GPT, GPTConfig
from torch_tpu.execution import fused
from torch_tpu.runtime import memory, platform

# Each test compares steps bit for bit with the same steps run again: the churn that earlier tests
# (or these tests' failing graphs) taught the recorder must not cut the two runs differently
pytestmark = pytest.mark.usefixtures("fresh_churn")

XLA_OOM = "RESOURCE_EXHAUSTED: Out of memory while trying to allocate 123456 bytes."


def _model_and_optimizer():
    """(SGD with momentum: all its state lives on tpu; Adam keeps its step counts on the CPU,
    which no device-side undo can cover, as on CUDA)"""
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=16, block_size=8, n_layer=1, n_head=2, n_embd=16)).to("tpu")
    return model, torch.optim.SGD(model.parameters(), lr=1e-2, momentum=0.9)


def _step(model, optimizer, seed=0):
    generator = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, 16, (2, 8), generator=generator).to("tpu")
    _, loss = model(tokens, tokens)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def _state(model, optimizer) -> dict:
    state = {f"model.{k}": v.cpu().clone() for k, v in model.state_dict().items()}
    for i, s in enumerate(optimizer.state.values()):
        state.update({f"opt.{i}.{k}": v.cpu().clone() for k, v in s.items()})
    return state


def _assert_same(a: dict, b: dict):
    assert a.keys() == b.keys()
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=0, atol=0, msg=key)


class _FailingRuns:
    """Make fused graphs run through ``effect(executable, leaves)``, which may fail or misbehave
    around the real run."""

    def __init__(self, monkeypatch, effect):
        monkeypatch.setattr(fused, "_execute", effect)


def _fail_with_xla_oom(executable, leaves):  # as XLA reports it
    raise RuntimeError(XLA_OOM)


def test_a_failed_graph_keeps_every_previous_value(monkeypatch):
    """The optimizer step's graph fails: parameters and Adam state keep their values (the old
    buffers were not given away), the error is torch.OutOfMemoryError, and training goes on."""
    model, optimizer = _model_and_optimizer()
    with torch_tpu.eager_mode("fused"):
        for seed in range(2):  # (the first steps create the optimizer's state)
            _step(model, optimizer, seed)
        before = _state(model, optimizer)
        reference_model, reference_optimizer = _model_and_optimizer()
        reference_model.load_state_dict(model.state_dict())
        reference_optimizer.load_state_dict(copy.deepcopy(optimizer.state_dict()))

        tokens = torch.randint(0, 16, (2, 8)).to("tpu")
        model(tokens, tokens)[1].backward()
        _FailingRuns(monkeypatch, _fail_with_xla_oom)  # the optimizer step's graph fails
        with pytest.raises(torch.OutOfMemoryError, match="123456 bytes.*in total"):
            optimizer.step()
        monkeypatch.undo()
        _assert_same(_state(model, optimizer), before)
        torch.save(model.state_dict(), io.BytesIO())
        optimizer.zero_grad(set_to_none=True)
        _step(model, optimizer, seed=3)  # the process and the model are still usable
        _step(reference_model, reference_optimizer, seed=3)
        _assert_same(_state(model, optimizer), _state(reference_model, reference_optimizer))


def test_values_a_failed_graph_was_to_create_name_the_error(monkeypatch):
    with torch_tpu.eager_mode("fused"):
        x = torch.ones(4, device="tpu")
        x.sum().item()
        y = x * 2
        _FailingRuns(monkeypatch, _fail_with_xla_oom)
        with pytest.raises(torch.OutOfMemoryError):
            y.sum().item()
        monkeypatch.undo()
        with pytest.raises(
            RuntimeError, match="has no value: the fused graph computing it failed .*RESOURCE_EXHAUSTED"
        ):
            y.cpu()
        assert x.sum().item() == 4.0


def test_an_interrupt_while_a_graph_runs_is_delivered_after_its_results_are_stored(monkeypatch):
    # (and the handler torch_tpu installs: a library loaded earlier in this worker may have left
    # SIGINT ignored, which would rightly swallow the delivered signal)
    previous = signal.signal(signal.SIGINT, platform._interrupt)
    try:
        _interrupt_while_a_graph_runs(monkeypatch)
    finally:
        signal.signal(signal.SIGINT, previous)


def _interrupt_while_a_graph_runs(monkeypatch):
    model, optimizer = _model_and_optimizer()
    reference_model, reference_optimizer = _model_and_optimizer()
    tokens = torch.randint(0, 16, (2, 8)).to("tpu")
    with torch_tpu.eager_mode("fused"):
        _step(model, optimizer)
        _step(reference_model, reference_optimizer)

        runs = []

        def interrupted(executable, leaves):
            results = executable(*leaves)
            runs.append(len(leaves))
            signal.raise_signal(signal.SIGINT)  # Ctrl-C lands right after XLA returns
            return results

        _FailingRuns(monkeypatch, interrupted)
        try:
            model(tokens, tokens)[1].backward()  # the graph runs at the end of backward()
        except KeyboardInterrupt:
            pass
        else:
            pytest.fail(
                f"no KeyboardInterrupt: {len(runs)} graphs ran, SIGINT handler "
                f"{signal.getsignal(signal.SIGINT)!r}, last sync {execution.last_sync_reason()!r}"
            )
        monkeypatch.undo()
        reference_model(tokens, tokens)[1].backward()
        for p, q in zip(model.parameters(), reference_model.parameters()):
            torch.testing.assert_close(p.grad.cpu(), q.grad.cpu(), rtol=0, atol=0)
        optimizer.step()
        reference_optimizer.step()
        _assert_same(_state(model, optimizer), _state(reference_model, reference_optimizer))


def test_an_interrupt_while_a_graph_compiles_leaves_it_pending(monkeypatch):
    with torch_tpu.eager_mode("fused"):
        x = torch.arange(37.0, device="tpu")  # a graph of its own: compiled here
        y = (x.sin() * 7).cumsum(0).flip(0)
        expected = (torch.arange(37.0).sin() * 7).cumsum(0).flip(0)
        real_jit = fused.jax.jit

        def interrupted_jit(*args, **kwargs):
            monkeypatch.setattr(fused.jax, "jit", real_jit)
            raise KeyboardInterrupt

        monkeypatch.setattr(fused.jax, "jit", interrupted_jit)
        with pytest.raises(KeyboardInterrupt):
            y.cpu()
        assert execution.pending_ops() > 0  # nothing was lost: the graph is still there
        torch.testing.assert_close(y.cpu(), expected)


def test_an_interrupt_inside_jax_gc_callback_is_not_swallowed(monkeypatch):
    """Ctrl-C landing while JAX's gc callback runs reaches the user's code after the collection
    (CPython drops exceptions raised inside gc callbacks)."""
    from jax._src import lib

    from torch_tpu.runtime import platform

    torch.ones(1, device="tpu").sum().item()  # (the device has started)
    monkeypatch.setattr(signal, "getsignal", lambda _: signal.default_int_handler)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        platform.keep_interrupts()
        monkeypatch.undo()
        armed = []

        def interrupt_once():  # (only in the collection below: any other one stays quiet)
            if armed:
                armed.clear()
                signal.raise_signal(signal.SIGINT)

        monkeypatch.setattr(lib._jax, "collect_garbage", interrupt_once)
        reached = []
        with pytest.raises(KeyboardInterrupt):
            armed.append(True)
            gc.collect()
            reached.append("after the collection")
            time.sleep(0.01)
        assert reached == []  # raised at the first event after the collection
    finally:
        monkeypatch.undo()
        signal.signal(signal.SIGINT, previous)


def test_an_impossible_empty_fails_at_empty():
    total = memory.total_memory()
    with pytest.raises(torch.OutOfMemoryError, match=r"Tried to allocate .*; the device .* has"):
        torch.empty(total // 4 + 1, dtype=torch.float64, device="tpu")
    big = torch.empty(1024, 1024, device="tpu")  # a possible one still allocates nothing yet
    assert big.shape == (1024, 1024)


def test_xla_out_of_memory_is_torch_out_of_memory():
    with pytest.raises(torch.OutOfMemoryError, match=r"\(4398046511104 bytes\)"):
        torch.ones(2**42, dtype=torch.uint8, device="tpu") + 1
    assert torch.ones(3, device="tpu").sum().item() == 3.0  # the process stays usable
    error = memory.translate(RuntimeError(XLA_OOM))
    assert isinstance(error, torch.OutOfMemoryError) and "123456 bytes" in str(error)
    other = ValueError("something else")
    assert memory.translate(other) is other
