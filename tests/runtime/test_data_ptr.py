"""``data_ptr()`` of tpu storages and tensors: a handle per storage (never dereferenced), unique
and non-null while the storage lives, with views offset from it as on CPU."""

from __future__ import annotations

import pytest
import torch

from . import needs_native

pytestmark = needs_native

DEVICES = ("cpu", "tpu")


@pytest.mark.parametrize("device", DEVICES)
def test_each_storage_has_its_own_nonnull_pointer(device):
    tensors = [torch.ones(n + 1, device=device) for n in range(32)]
    pointers = [t.untyped_storage().data_ptr() for t in tensors]
    assert 0 not in pointers and len(set(pointers)) == len(pointers)
    # storages do not overlap: no view of one reaches another's pointer
    spans = sorted((p, p + t.untyped_storage().nbytes()) for p, t in zip(pointers, tensors))
    assert all(end <= start for (_, end), (start, _) in zip(spans, spans[1:]))


@pytest.mark.parametrize("device", DEVICES)
def test_views_share_or_offset_the_storage_pointer(device):
    base = torch.arange(24, dtype=torch.float64, device=device).reshape(4, 6)
    pointer = base.untyped_storage().data_ptr()
    assert base.data_ptr() == pointer
    assert base.t().data_ptr() == base.view(24).data_ptr() == pointer
    for view in (base[1], base[2:, 3], base.view(torch.int32)[1, 5:], base.flatten()[7:].view(1, 17)):
        assert view.untyped_storage().data_ptr() == pointer
        assert view.data_ptr() == pointer + view.storage_offset() * view.element_size()


def test_pointers_agree_with_cpu_semantics():
    cpu = torch.arange(10.0)
    tpu = cpu.to("tpu")
    for make in (lambda t: t[3:], lambda t: t[::2][1:], lambda t: t.view(2, 5)[1, 2:]):
        assert make(tpu).data_ptr() - tpu.data_ptr() == make(cpu).data_ptr() - cpu.data_ptr()
    assert torch.empty(0, device="tpu").data_ptr() == torch.empty(0).data_ptr() == 0


def test_a_clone_has_another_pointer_and_storage_sharing_is_detected():
    a = torch.ones(8, device="tpu")
    tied = a.view(2, 4)
    assert a.clone().data_ptr() != a.data_ptr()
    # how safetensors and transformers find tensors that share memory
    assert tied.untyped_storage().data_ptr() == a.untyped_storage().data_ptr()
    assert torch.ones(8, device="tpu").untyped_storage().data_ptr() != a.untyped_storage().data_ptr()
