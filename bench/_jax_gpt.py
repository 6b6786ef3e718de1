"""The demo GPT (``torch_tpu.demo.model.GPT``) and its AdamW training step written by hand in JAX.

Pure functions over a params pytree with the layout of the torch module (GELU MLP, LayerNorm with
bias, tied LM head, learned position embedding), so :func:`params_from_torch` can copy a torch
model's weights in and ``bench_fused.py`` can check both compute the same loss and update. This is
the "what a JAX user would write" baseline: one ``jax.jit`` of loss, ``jax.value_and_grad`` and
an AdamW update with PyTorch's semantics, params and optimizer state donated.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import torch

Params = dict[str, Any]

#: nn.LayerNorm's default
LAYER_NORM_EPS = 1e-5


@dataclasses.dataclass(frozen=True)
class AdamW:
    """torch.optim.AdamW's hyperparameters (its defaults, but lr)."""

    lr: float = 1e-3
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8
    weight_decay: float = 0.01


def params_from_torch(model: torch.nn.Module) -> Params:
    """The weights of a torch ``GPT`` (GELU MLP, LayerNorm with bias, tied head) as a pytree of
    float32 jax arrays, nested like the module's attribute names."""
    config = model.config
    if not config.tie_weights or config.mlp != "gelu" or config.norm != "layernorm":
        raise ValueError("the JAX GPT implements tie_weights=True, mlp='gelu', norm='layernorm'")
    params: Params = {}
    # named_parameters() lists the tied lm_head.weight once, as token_embedding.weight
    for name, parameter in model.named_parameters():
        node = params
        *path, leaf = name.split(".")
        for key in path:
            node = node.setdefault(key, {})
        node[leaf] = jnp.asarray(parameter.detach().cpu().numpy())
    params["blocks"] = [params["blocks"][str(i)] for i in range(len(params["blocks"]))]
    return params


def _linear(layer: Params, x: jax.Array) -> jax.Array:
    return x @ layer["weight"].T + layer["bias"]


def _layer_norm(norm: Params, x: jax.Array) -> jax.Array:
    mean = x.mean(-1, keepdims=True)
    variance = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) * jax.lax.rsqrt(variance + LAYER_NORM_EPS) * norm["weight"] + norm["bias"]


def _attention(layer: Params, x: jax.Array, n_head: int) -> jax.Array:
    batch, time, channels = x.shape
    q, k, v = jnp.split(_linear(layer["qkv"], x), 3, axis=-1)
    # (B, T, C) -> (B, heads, T, head_dim)
    q, k, v = (t.reshape(batch, time, n_head, -1).transpose(0, 2, 1, 3) for t in (q, k, v))
    scores = q @ k.transpose(0, 1, 3, 2) / jnp.sqrt(jnp.float32(q.shape[-1]))
    causal = jnp.tril(jnp.ones((time, time), dtype=bool))
    weights = jax.nn.softmax(jnp.where(causal, scores, -jnp.inf), axis=-1)
    y = (weights @ v).transpose(0, 2, 1, 3).reshape(batch, time, channels)
    return _linear(layer["proj"], y)


def _block(block: Params, x: jax.Array, n_head: int) -> jax.Array:
    x = x + _attention(block["attn"], _layer_norm(block["norm1"], x), n_head)
    hidden = jax.nn.gelu(_linear(block["mlp"]["up"], _layer_norm(block["norm2"], x)), approximate=False)
    return x + _linear(block["mlp"]["down"], hidden)


def loss_fn(params: Params, idx: jax.Array, targets: jax.Array, n_head: int) -> jax.Array:
    """Mean token cross-entropy of the GPT on ``idx`` (B, T) against ``targets`` (B, T)."""
    embedding = params["token_embedding"]["weight"]
    x = embedding[idx] + params["position_embedding"]["weight"][: idx.shape[1]]
    for block in params["blocks"]:
        x = _block(block, x, n_head)
    logits = _layer_norm(params["final_norm"], x) @ embedding.T  # lm_head tied to the embedding
    log_probs = jax.nn.log_softmax(logits, axis=-1)
    return -jnp.take_along_axis(log_probs, targets[..., None], axis=-1).mean()


def init_adamw(params: Params) -> Params:
    """AdamW state: zero moments and a float32 step count, like torch's."""

    def zeros() -> Params:
        return jax.tree_util.tree_map(jnp.zeros_like, params)

    return {"step": jnp.zeros((), jnp.float32), "exp_avg": zeros(), "exp_avg_sq": zeros()}


def adamw_update(params: Params, grads: Params, state: Params, hp: AdamW) -> tuple[Params, Params]:
    """One torch.optim.AdamW step (decoupled weight decay, bias correction, no amsgrad)."""
    step = state["step"] + 1
    bias_correction1 = 1 - hp.beta1**step
    bias_correction2_sqrt = jnp.sqrt(1 - hp.beta2**step)
    step_size = hp.lr / bias_correction1

    def update(param, grad, exp_avg, exp_avg_sq):
        param = param * (1 - hp.lr * hp.weight_decay)
        exp_avg = exp_avg + (grad - exp_avg) * (1 - hp.beta1)  # torch's lerp_
        exp_avg_sq = exp_avg_sq * hp.beta2 + grad * grad * (1 - hp.beta2)
        denom = jnp.sqrt(exp_avg_sq) / bias_correction2_sqrt + hp.eps
        return param - step_size * exp_avg / denom, exp_avg, exp_avg_sq

    leaves, treedef = jax.tree_util.tree_flatten(params)
    rows = zip(
        leaves, *(treedef.flatten_up_to(tree) for tree in (grads, state["exp_avg"], state["exp_avg_sq"]))
    )
    new_params, exp_avg, exp_avg_sq = (
        treedef.unflatten(column) for column in zip(*(update(*row) for row in rows))
    )
    return new_params, {"step": step, "exp_avg": exp_avg, "exp_avg_sq": exp_avg_sq}


def make_train_step(n_head: int, hp: AdamW = AdamW()) -> Callable:
    """``step(params, opt_state, idx, targets) -> (params, opt_state, loss)``, jitted, with the
    params and optimizer state donated (their buffers are reused for the updated ones)."""

    def step(params: Params, opt_state: Params, idx: jax.Array, targets: jax.Array):
        loss, grads = jax.value_and_grad(loss_fn)(params, idx, targets, n_head)
        params, opt_state = adamw_update(params, grads, opt_state, hp)
        return params, opt_state, loss

    return jax.jit(step, donate_argnums=(0, 1))


def max_relative_difference(ours: Params, reference: Params) -> float:
    """Largest ``max|ours - reference| / max|reference|`` over the tensors of two pytrees."""
    worst = 0.0
    for a, b in zip(jax.tree_util.tree_leaves(ours), jax.tree_util.tree_leaves(reference), strict=True):
        a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
        scale = max(float(np.abs(b).max()), np.finfo(np.float32).tiny)
        worst = max(worst, float(np.abs(a - b).max()) / scale)
    return worst
