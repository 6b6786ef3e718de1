"""Host <-> device copies (numpy has no bfloat16 for torch, so it travels as int16 bits)."""
from __future__ import annotations

import jax
import numpy as np
import torch
from jax import lax
import jax.numpy as jnp

from . import _runtime


def to_device(host: torch.Tensor) -> jax.Array:
    """A device copy of a CPU tensor (never aliasing it: torch may mutate the host tensor later)."""
    host = host.detach().resolve_conj().resolve_neg().contiguous()
    if host.dtype == torch.bfloat16:
        bits = jax.device_put(host.view(torch.int16).numpy(), _runtime.device(), may_alias=False)
        return lax.bitcast_convert_type(bits, jnp.bfloat16)
    return jax.device_put(host.numpy(), _runtime.device(), may_alias=False)


def to_host(value: jax.Array) -> torch.Tensor:
    """A CPU tensor with the value's contents."""
    if value.dtype == jnp.bfloat16:
        bits = np.asarray(lax.bitcast_convert_type(value, jnp.int16))
        return torch.from_numpy(bits.copy()).view(torch.bfloat16)
    return torch.from_numpy(np.array(value, copy=True))
