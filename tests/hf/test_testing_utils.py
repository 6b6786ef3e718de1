"""Transformers' device-agnostic test utilities (``TRANSFORMERS_TEST_DEVICE=tpu``) on tpu: its
seed, sync, cache and device-count dispatch, and the accelerator memory queries its device spec
files point at."""

from __future__ import annotations

import torch
from transformers import testing_utils

DEVICE = "tpu"


def test_transformers_picks_tpu_as_its_test_device():
    assert testing_utils.torch_device == DEVICE
    assert testing_utils.backend_torch_accelerator_module(DEVICE) is torch.tpu


def test_seeding_gives_the_same_stream():
    testing_utils.backend_manual_seed(DEVICE, 11)
    first = torch.randn(6, device=DEVICE)
    testing_utils.backend_manual_seed(DEVICE, 11)
    assert torch.equal(torch.randn(6, device=DEVICE).cpu(), first.cpu())
    assert testing_utils.backend_device_count(DEVICE) == torch.accelerator.device_count() >= 1


def test_synchronize_empty_cache_and_memory_queries():
    testing_utils.backend_empty_cache(DEVICE)
    torch.accelerator.reset_peak_memory_stats()
    before = torch.accelerator.memory_allocated()
    x = torch.ones(1024, 1024, device=DEVICE) * 2
    testing_utils.backend_synchronize(DEVICE)  # waits for the queued work
    grown = torch.accelerator.memory_allocated()
    assert grown >= before + x.numel() * x.element_size()
    assert torch.accelerator.max_memory_allocated() >= grown
    del x
    testing_utils.backend_empty_cache(DEVICE)
    assert torch.accelerator.memory_allocated() < grown
