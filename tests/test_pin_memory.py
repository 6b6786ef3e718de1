"""``pin_memory()`` and ``DataLoader(pin_memory=True)`` when tpu is the accelerator."""

from __future__ import annotations

import torch

from tests.runtime import needs_native


def test_pin_memory_returns_an_equal_cpu_copy():
    host = torch.arange(6.0).reshape(2, 3).t()
    pinned = host.pin_memory()
    assert pinned.device.type == "cpu"
    assert torch.equal(pinned, host) and pinned.data_ptr() != host.data_ptr()
    assert torch.equal(pinned.to("tpu", non_blocking=True).cpu(), host)


@needs_native
def test_pinned_memory_is_pinned_as_for_cuda():
    host = torch.arange(6.0).reshape(2, 3).t()
    pinned = host.pin_memory()
    assert pinned.is_pinned() and not host.is_pinned()
    assert pinned.stride() == host.stride()  # PyTorch's own kernel: the layout is kept
    assert pinned[1:].is_pinned()  # inside the pinned block
    assert torch.empty(3, pin_memory=True).is_pinned()
    assert not pinned.clone().is_pinned()


def test_dataloader_pins_batches():
    data = torch.utils.data.TensorDataset(torch.arange(8.0), torch.arange(8))
    loader = torch.utils.data.DataLoader(data, batch_size=4, pin_memory=True)
    batches = [[t.to("tpu", non_blocking=True) for t in batch] for batch in loader]
    assert torch.equal(torch.cat([x for x, _ in batches]).cpu(), torch.arange(8.0))


@needs_native
def test_dataloader_batches_are_pinned():
    data = torch.utils.data.TensorDataset(torch.arange(8.0), torch.arange(8))
    for x, y in torch.utils.data.DataLoader(data, batch_size=4, pin_memory=True):
        assert x.is_pinned() and y.is_pinned()


def test_empty_host_cache_keeps_pinned_blocks():
    # vLLM calls it at every shutdown; PyTorch's version crashed on tpu (no caching host allocator).
    pinned = torch.arange(4.0).pin_memory()
    torch.accelerator.empty_host_cache()
    assert torch.equal(pinned, torch.arange(4.0))
