"""``torch.accelerator`` on tpu: device count and index, synchronize, streams and events, and the
memory statistics (the same numbers as ``torch.tpu``'s)."""

from __future__ import annotations

import pytest
import torch

from . import needs_native

pytestmark = needs_native

_ORDINAL = "tpu error: invalid device ordinal: tpu:1"


def test_device_count_and_index():
    assert torch.accelerator.device_count() == torch.tpu.device_count() == 1
    assert torch.accelerator.current_device_index() == torch.tpu.current_device() == 0
    torch.accelerator.set_device_index(0)
    with torch.tpu.device(0), torch.accelerator.device_index(0):
        assert torch.tpu.current_device() == 0


@pytest.mark.parametrize(
    "request_",
    [
        lambda: torch.accelerator.set_device_index(1),
        lambda: torch.tpu.set_device("tpu:1"),
        lambda: torch.tpu.device(1),
        lambda: torch.tpu.synchronize(1),
        lambda: torch.accelerator.memory_allocated(1),
        lambda: torch.ones(2, device="tpu:1"),
        lambda: torch.empty(2, device="tpu:1"),
        lambda: torch.ones(2).to("tpu:1"),
        lambda: torch.Generator(device="tpu:1"),
    ],
)
def test_another_device_index_is_refused_not_served_by_tpu0(request_):
    with pytest.raises(RuntimeError, match=_ORDINAL):
        request_()


def test_synchronize_waits_for_queued_work():
    x = torch.randn(128, 128, device="tpu")
    y = x @ x
    torch.accelerator.synchronize()
    torch.accelerator.synchronize(0)
    torch.tpu.synchronize()
    assert torch.allclose(y.cpu(), x.cpu() @ x.cpu(), rtol=1e-4, atol=1e-3)


def test_streams_are_the_one_in_order_stream():
    stream = torch.accelerator.current_stream()
    assert stream.device == torch.device("tpu", 0)
    assert torch.Stream(device="tpu") == stream
    x = torch.ones(4, device="tpu")
    with torch.Stream(device="tpu") as s:
        y = x + 1
    s.synchronize()
    assert s.query() and torch.equal(y.cpu(), torch.full((4,), 2.0))


def test_events_order_and_time():
    start, end = torch.Event(device="tpu", enable_timing=True), torch.Event(device="tpu", enable_timing=True)
    start.record()
    y = torch.randn(64, 64, device="tpu") @ torch.randn(64, 64, device="tpu")
    end.record()
    end.synchronize()
    torch.accelerator.current_stream().wait_event(end)
    assert start.query() and end.query()
    assert start.elapsed_time(end) >= 0 and y.shape == (64, 64)
    untimed = torch.Event(device="tpu")
    untimed.record()
    with pytest.raises(ValueError, match="enable_timing=True"):
        untimed.elapsed_time(end)


def test_memory_allocated_grows_with_a_tensor_and_drops_after_del():
    torch.accelerator.synchronize()
    before = torch.accelerator.memory_allocated()
    x = torch.ones(1 << 20, device="tpu") + 1  # a materialized 4 MiB result
    held = torch.accelerator.memory_allocated()
    assert held >= before + x.numel() * 4
    assert held == torch.tpu.memory_allocated() == torch.tpu.memory_stats()["allocated_bytes.all.current"]
    del x
    assert torch.accelerator.memory_allocated() <= held - (1 << 22)
    assert torch.accelerator.max_memory_allocated() >= held


def test_reset_peak_memory_stats():
    x = torch.ones(1 << 20, device="tpu") + 1
    peak = torch.accelerator.max_memory_allocated()
    del x
    torch.accelerator.reset_peak_memory_stats()
    after = torch.accelerator.max_memory_allocated()
    assert after < peak and after == torch.tpu.max_memory_allocated()
    assert torch.accelerator.memory_stats()["allocated_bytes.all.peak"] == after
    stats = torch.tpu.memory_stats()  # (CUDA's peak keys, which trainers such as TorchTitan log)
    assert stats["active_bytes.all.peak"] == stats["allocated_bytes.all.peak"] == after
    assert stats["reserved_bytes.all.peak"] == torch.tpu.max_memory_reserved() >= after


def test_memory_info_and_empty_cache():
    free, total = torch.accelerator.get_memory_info()
    assert (free, total)[1] == torch.tpu.mem_get_info()[1] == torch.tpu.get_device_properties().total_memory
    assert 0 < free <= total
    torch.accelerator.empty_cache()
    assert torch.accelerator.memory_reserved() >= torch.accelerator.memory_allocated() > 0
