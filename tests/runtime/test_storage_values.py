"""The C++ core's two storage-value calls (``tensor.whole_value``, ``tensor._wrap_value``): they
answer only the common case, identically to the Python path, and None for everything else."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest
import torch

import torch_tpu
from torch_tpu.runtime import buffer, platform, tensor

from . import needs_native

pytestmark = needs_native


def _views() -> dict[str, torch.Tensor]:
    base = torch.arange(24, dtype=torch.float32, device="tpu").reshape(4, 6) * 1  # its own array
    complex_base = torch.randn(3, dtype=torch.complex64).to("tpu")
    return {
        "whole": base,
        "whole, int64": torch.arange(5, device="tpu"),
        "whole, 0-dim": torch.tensor(2.5, device="tpu"),
        "whole, empty": torch.ones(0, 3, device="tpu"),
        "whole, complex": complex_base,
        "row (an offset)": base[1],
        "first row (a smaller shape)": base[0],
        "reshaped (another shape)": base.view(24),
        "transposed": base.t(),
        "strided": base[:, ::2],
        "expanded": torch.ones(1, 6, device="tpu").expand(3, 6),
        "another dtype": base.view(torch.int32),
        "conjugate": complex_base.conj(),
        "negative bit": complex_base.conj().imag,
        "cpu": torch.ones(3),
    }


_WHOLE = {name for name in _views() if name.startswith("whole")}


@pytest.mark.parametrize("name", list(_views()))
def test_whole_value_is_the_storage_value_only_for_a_tensor_that_is_all_of_it(name):
    t = _views()[name]
    value = tensor.whole_value(t)
    if name in _WHOLE:
        assert value is buffer.get(t.untyped_storage())
    else:
        assert value is None
    if t.device.type == "tpu":  # the read with and without the shortcut agrees with CPU
        expected = t.cpu().resolve_conj().resolve_neg()
        torch.testing.assert_close(torch.from_numpy(jax.device_get(tensor.read_resolved(t)).copy()), expected)


_NOT_TPU_TENSORS = [None, 1, 2.0, "x", [torch.ones(1, device="tpu")], torch.ones(1, device="meta")]


@pytest.mark.parametrize("value", _NOT_TPU_TENSORS)
def test_whole_value_of_anything_but_a_tpu_tensor_is_none(value):
    assert tensor.whole_value(value) is None


def test_whole_value_takes_a_pending_deferred_value_and_swaps_in_a_computed_ones_array():
    x = torch.ones(4, device="tpu")
    with torch_tpu.eager_mode("fused"):
        y = x + 1
        pending = buffer.get(y.untyped_storage())
        assert type(pending) is buffer.Deferred and tensor.whole_value(y) is pending
        torch_tpu.sync()
        assert pending.value is not None
        storage = y.untyped_storage()
        assert getattr(storage, buffer.STORAGE_ATTR) is pending  # (until its first read)
        assert tensor.whole_value(y) is pending.value  # (as buffer.get: the storage keeps the array)
        assert getattr(storage, buffer.STORAGE_ATTR) is pending.value
        assert tensor.read(y) is pending.value
    assert y.tolist() == [2.0] * 4


def test_wrap_value_attaches_a_committed_array_or_a_pending_deferred_one():
    committed = jax.device_put(jnp.arange(6, dtype=jnp.int32).reshape(2, 3), platform.device())
    t = tensor._wrap_value(committed)
    assert (t.dtype, tuple(t.shape), t.stride(), t.device.type) == (torch.int32, (2, 3), (3, 1), "tpu")
    assert buffer.get(t.untyped_storage()) is committed
    assert t.untyped_storage().nbytes() == 24
    assert t.tolist() == [[0, 1, 2], [3, 4, 5]]
    with torch_tpu.eager_mode("fused"):
        y = torch.ones(3, device="tpu") * 2
        pending = buffer.get(y.untyped_storage())
        w = tensor._wrap_value(pending)
        assert buffer.get(w.untyped_storage()) is pending
    assert w.tolist() == [2.0] * 3


def test_wrap_value_leaves_an_uncommitted_array_and_an_unknown_dtype_to_python():
    uncommitted = jnp.ones(3)
    assert not uncommitted.committed
    assert tensor._wrap_value(uncommitted) is None
    t = tensor.wrap(uncommitted)  # put on the device first
    assert buffer.get(t.untyped_storage()).committed and t.tolist() == [1.0] * 3
    assert tensor._wrap_value(jax.device_put(jnp.ones(2, jnp.int4), platform.device())) is None
    with pytest.raises(TypeError):
        tensor.wrap(jax.device_put(jnp.ones(2, jnp.int4), platform.device()))
