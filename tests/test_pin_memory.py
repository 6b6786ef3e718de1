"""``pin_memory()`` and ``DataLoader(pin_memory=True)`` when tpu is the accelerator."""

from __future__ import annotations

import torch


def test_pin_memory_returns_an_equal_cpu_copy():
    host = torch.arange(6.0).reshape(2, 3).t()
    pinned = host.pin_memory()
    assert pinned.device.type == "cpu" and pinned.is_contiguous()
    assert torch.equal(pinned, host) and pinned.data_ptr() != host.data_ptr()
    assert torch.equal(pinned.to("tpu", non_blocking=True).cpu(), host)


def test_dataloader_pins_batches():
    data = torch.utils.data.TensorDataset(torch.arange(8.0), torch.arange(8))
    loader = torch.utils.data.DataLoader(data, batch_size=4, pin_memory=True)
    batches = [[t.to("tpu", non_blocking=True) for t in batch] for batch in loader]
    assert torch.equal(torch.cat([x for x, _ in batches]).cpu(), torch.arange(8.0))
