"""Recurrent cells: the fused LSTM and GRU cell kernels and their backwards.

``nn.LSTM``/``nn.GRU``/``nn.RNN`` and their ``*Cell`` modules run PyTorch's own composite code
on tpu (``aten::lstm``, ``gru``, ``lstm_cell``... are CompositeImplicitAutograd): it loops over
time steps and layers, packed sequences included, with matmuls for the gate pre-activations.
For a CUDA or PrivateUse1 input that code hands the pointwise part of an LSTM or GRU step to
``_thnn_fused_lstm_cell``/``_thnn_fused_gru_cell``, whose CUDA kernels save their activated
gates in a ``workspace`` for the backward; the layouts here are those kernels', so PyTorch's
autograd formulas (``derivatives.yaml``) read them unchanged. The tanh/relu RNN cell is
elementwise ops only.
"""

from __future__ import annotations

import jax.numpy as jnp
import torch
from jax import nn as jnn

from ._nn_helpers import compute_dtype
from .registry import lower

aten = torch.ops.aten


def _check_gates(name: str, input_gates, hidden_gates, input_bias, hidden_bias, factor: int, prev):
    """The CUDA kernels' argument checks (``checkSizes`` in RNN.cu), with their messages."""

    def fail(message: str):
        raise RuntimeError(f"Expected {message} (while checking arguments for {name})")

    if input_gates.ndim != 2:
        fail(f"2-dimensional tensor, but got {input_gates.ndim}-dimensional tensor for input_gates")
    if hidden_gates.shape != input_gates.shape:
        fail(
            f"hidden_gates of size {list(hidden_gates.shape)} to match input_gates {list(input_gates.shape)}"
        )
    batch, gates = input_gates.shape
    if input_bias is not None:
        if input_bias.ndim != 1 or input_bias.size != gates:
            fail(f"input_bias to be 1-dimensional with {gates} elements, got {list(input_bias.shape)}")
        if hidden_bias is None or hidden_bias.shape != input_bias.shape:
            fail("hidden_bias to have the size of input_bias")
    if prev.ndim != 2 or prev.size != batch * gates // factor:
        fail(f"a 2-dimensional hidden state with {batch * gates // factor} elements, got {list(prev.shape)}")


def _biased(gates, bias, compute):
    gates = gates.astype(compute)
    return gates if bias is None else gates + bias.astype(compute)


def _sigmoid_grad(y):
    return (1 - y) * y


def _tanh_grad(y):
    return 1 - y * y


# ----------------------------------------------------------------------------- LSTM
def _check_lstm(input_gates, hidden_gates, cx, input_bias=None, hidden_bias=None):
    _check_gates("_thnn_fused_lstm_cell", input_gates, hidden_gates, input_bias, hidden_bias, 4, cx)


@lower(aten._thnn_fused_lstm_cell.default, check=_check_lstm)
def fused_lstm_cell(input_gates, hidden_gates, cx, input_bias=None, hidden_bias=None):
    """(hy, cy, workspace): gates in PyTorch's order (input, forget, cell, output); the
    workspace holds them activated, side by side per row."""
    compute = compute_dtype(input_gates.dtype)
    pre = _biased(input_gates, input_bias, compute) + _biased(hidden_gates, hidden_bias, compute)
    i, f, g, o = jnp.split(pre, 4, axis=1)
    i, f, g, o = jnn.sigmoid(i), jnn.sigmoid(f), jnp.tanh(g), jnn.sigmoid(o)
    cy = f * cx.astype(compute) + i * g
    hy = o * jnp.tanh(cy)
    dtype = input_gates.dtype
    return hy.astype(dtype), cy.astype(dtype), jnp.concatenate([i, f, g, o], axis=1).astype(dtype)


@lower(aten._thnn_fused_lstm_cell_backward_impl.default)
def fused_lstm_cell_backward(grad_hy, grad_cy, cx, cy, workspace, has_bias):
    """(grad_gates, grad_cx, grad_bias) from the saved activated gates; a missing output
    gradient counts as zeros."""
    compute = compute_dtype(workspace.dtype)
    i, f, g, o = jnp.split(workspace.astype(compute), 4, axis=1)
    cy, cx = cy.astype(compute), cx.astype(compute)
    grad_hy = jnp.zeros_like(cy) if grad_hy is None else grad_hy.astype(compute)
    grad_cy = jnp.zeros_like(cy) if grad_cy is None else grad_cy.astype(compute)
    tanh_cy = jnp.tanh(cy)
    grad_c = grad_hy * o * _tanh_grad(tanh_cy) + grad_cy
    grad_gates = jnp.concatenate(
        [
            grad_c * g * _sigmoid_grad(i),
            grad_c * cx * _sigmoid_grad(f),
            grad_c * i * _tanh_grad(g),
            grad_hy * tanh_cy * _sigmoid_grad(o),
        ],
        axis=1,
    )
    dtype = workspace.dtype
    grad_bias = grad_gates.sum(0).astype(dtype) if has_bias else None
    return grad_gates.astype(dtype), (grad_c * f).astype(dtype), grad_bias


# ----------------------------------------------------------------------------- GRU
def _check_gru(input_gates, hidden_gates, hx, input_bias=None, hidden_bias=None):
    _check_gates("_thnn_fused_gru_cell", input_gates, hidden_gates, input_bias, hidden_bias, 3, hx)


@lower(aten._thnn_fused_gru_cell.default, check=_check_gru)
def fused_gru_cell(input_gates, hidden_gates, hx, input_bias=None, hidden_bias=None):
    """(hy, workspace): gates in PyTorch's order (reset, update, new); the workspace holds per
    row the reset, update and new gates, ``hx`` and the biased hidden part of the new gate."""
    compute = compute_dtype(input_gates.dtype)
    ir, ii, in_ = jnp.split(_biased(input_gates, input_bias, compute), 3, axis=1)
    hr, hi, hn = jnp.split(_biased(hidden_gates, hidden_bias, compute), 3, axis=1)
    hx = hx.astype(compute)
    r, z = jnn.sigmoid(ir + hr), jnn.sigmoid(ii + hi)
    n = jnp.tanh(in_ + r * hn)
    hy = n + z * (hx - n)
    dtype = input_gates.dtype
    return hy.astype(dtype), jnp.concatenate([r, z, n, hx, hn], axis=1).astype(dtype)


@lower(aten._thnn_fused_gru_cell_backward.default)
def fused_gru_cell_backward(grad_hy, workspace, has_bias):
    """(grad_input_gates, grad_hidden_gates, grad_hx, grad_input_bias, grad_hidden_bias)."""
    compute = compute_dtype(workspace.dtype)
    r, z, n, hx, hn = jnp.split(workspace.astype(compute), 5, axis=1)
    grad_hy = grad_hy.astype(compute)
    grad_z = grad_hy * (hx - n) * _sigmoid_grad(z)
    grad_in = grad_hy * (1 - z) * _tanh_grad(n)
    grad_r = grad_in * hn * _sigmoid_grad(r)
    grad_input = jnp.concatenate([grad_r, grad_z, grad_in], axis=1)
    grad_hidden = jnp.concatenate([grad_r, grad_z, grad_in * r], axis=1)
    dtype = workspace.dtype
    biases = (grad_input.sum(0).astype(dtype), grad_hidden.sum(0).astype(dtype)) if has_bias else (None, None)
    return grad_input.astype(dtype), grad_hidden.astype(dtype), (grad_hy * z).astype(dtype), *biases
