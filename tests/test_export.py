"""``torch_tpu.export.to_stablehlo``: torch.export programs as StableHLO that JAX runs alone."""

from __future__ import annotations

import copy

import jax
import numpy as np
import pytest
import torch

import torch_tpu.frontends.export
from torch_tpu.demo.model import GPT, GPTConfig


def _run_artifact(program, *args: torch.Tensor) -> list[np.ndarray]:
    """The serialized artifact run by JAX alone: no torch, no torch_tpu in the call."""
    artifact = jax.export.deserialize(bytearray(program.serialized))
    state = [np.asarray(t.numpy()) for t in program.state]
    return [np.asarray(o) for o in artifact.call(*state, *(a.numpy() for a in args))]


def test_gpt_exports_to_stablehlo_and_jax_reproduces_it():
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=32, block_size=16, n_layer=2, n_head=2, n_embd=16)).eval()
    tokens = torch.randint(0, 32, (2, 16))
    program = torch_tpu.to_stablehlo(torch.export.export(model, (tokens,)))
    assert program.text.startswith("module @") and "stablehlo.dot_general" in program.text
    assert isinstance(program.serialized, bytes) and program.serialized
    assert program.state_names[0] == "token_embedding.weight" and program.input_names == ("idx",)
    (logits,) = _run_artifact(program, tokens)
    with torch.no_grad():
        expected, _ = model(tokens)
    np.testing.assert_allclose(logits, expected.numpy(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(program(tokens)[0], expected, rtol=1e-5, atol=1e-5)


def test_buffer_mutations_are_outputs():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.ReLU())
    x = torch.randn(2, 3, 8, 8)
    program = torch_tpu.to_stablehlo(torch.export.export(model, (x,)))  # training mode
    outputs = _run_artifact(program, x)
    assert len(program.output_names) == len(outputs) == 4  # 3 BatchNorm buffers, then the output
    reference = copy.deepcopy(model)
    expected = reference(x)
    np.testing.assert_allclose(outputs[-1], expected.detach().numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(outputs[0], reference[1].running_mean.numpy(), rtol=1e-5, atol=1e-6)


def test_dynamic_shapes_and_randomness_are_refused_clearly():
    model = torch.nn.Linear(4, 2)
    batch = torch.export.Dim("batch", min=2)
    dynamic = torch.export.export(model, (torch.ones(3, 4),), dynamic_shapes=({0: batch},))
    with pytest.raises(NotImplementedError, match="dynamic shape.*pad_to_bucket"):
        torch_tpu.to_stablehlo(dynamic)
    dropout = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Dropout(0.5)).train()
    with pytest.raises(NotImplementedError, match="random numbers.*eval mode"):
        torch_tpu.to_stablehlo(torch.export.export(dropout, (torch.ones(2, 4),)))


def test_docstring_example_runs():
    import doctest

    assert doctest.testmod(torch_tpu.frontends.export).failed == 0
