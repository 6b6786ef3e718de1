"""``untyped_storage().resize_()`` on tpu as on CPU, and as FSDP2 uses it: free a parameter's
storage (resize to 0: its device buffer goes) and allocate it again before copying into it."""

from __future__ import annotations

import pytest
import torch
from torch.distributed.fsdp._fully_shard._fsdp_param import alloc_storage, free_storage
from torch.distributed.utils import _alloc_storage, _free_storage

from . import needs_native

pytestmark = needs_native

DEVICES = ("cpu", "tpu")


def _over(storage, dtype: torch.dtype, n: int) -> torch.Tensor:
    return torch.empty(0, dtype=dtype, device=storage.device).set_(storage, 0, (n,), (1,))


@pytest.mark.parametrize("free, alloc", [(free_storage, alloc_storage), (_free_storage, None)])
def test_free_then_alloc_then_copy_in_as_fsdp2(free, alloc):
    results = {}
    for device in DEVICES:
        param = torch.arange(12.0, device=device).reshape(3, 4)
        view = param.view(12)
        free(param)
        assert param.untyped_storage().nbytes() == 0 and param.untyped_storage().data_ptr() == 0
        if alloc is None:
            _alloc_storage(param, param.shape)
        else:
            alloc(param)
        assert param.untyped_storage().nbytes() == 48 and param.untyped_storage().data_ptr() != 0
        param.copy_(torch.full((3, 4), 7.0))
        view[1] = -1.0  # views see the new bytes
        results[device] = param.cpu()
    torch.testing.assert_close(results["tpu"], results["cpu"])


@pytest.mark.parametrize("nbytes", [0, 8, 10, 24, 40])
def test_resize_keeps_the_first_bytes(nbytes):
    kept = min(nbytes, 24)  # (new bytes are uninitialized on CPU)
    results = {}
    for device in DEVICES:
        storage = torch.arange(6.0, device=device).untyped_storage()
        assert storage.resize_(nbytes) is storage and storage.nbytes() == nbytes
        results[device] = _over(storage, torch.uint8, kept).cpu()
    torch.testing.assert_close(results["tpu"], results["cpu"])


def test_a_resized_storage_has_a_new_handle():
    for device in DEVICES:
        storage = torch.ones(4, device=device).untyped_storage()
        before = storage.data_ptr()
        storage.resize_(64)
        assert storage.data_ptr() not in (0, before)


def test_an_unwritten_storage_stays_unallocated():
    storage = torch.empty(1 << 20, device="tpu").untyped_storage()
    before = torch.tpu.memory_allocated()
    storage.resize_(1 << 10)
    assert torch.tpu.memory_allocated() == before and storage.nbytes() == 1 << 10


def test_freeing_a_storage_frees_its_device_buffer():
    param = torch.ones(1 << 20, device="tpu") + 1
    torch.tpu.synchronize()
    held = torch.accelerator.memory_allocated()
    free_storage(param)
    assert torch.accelerator.memory_allocated() <= held - param.numel() * 4
    alloc_storage(param)
    param.fill_(2.0)
    assert param.sum().item() == 2.0 * (1 << 20)


def test_tensor_resize_grows_the_storage_handle_too():
    t = torch.zeros(0, device="tpu")
    assert t.untyped_storage().data_ptr() == 0
    t.resize_(16)
    storage = t.untyped_storage()
    assert storage.nbytes() == 64 and storage.data_ptr() != 0
    t.fill_(3.0)
    assert t.sum().item() == 48.0
