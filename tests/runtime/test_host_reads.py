"""Copies to the host: a view of a small storage is read through its whole storage on the host,
and bfloat16 crosses as its bits, so that neither compiles a program per shape or view."""

from __future__ import annotations

import pytest
import torch

import torch_tpu
from torch_tpu.runtime import tensor as tpu_tensor

DTYPES = [torch.float32, torch.bfloat16, torch.int64, torch.uint8, torch.bool, torch.complex64]

VIEWS = {
    "prefix": lambda x: x[:, :5],
    "rows": lambda x: x[1:],
    "transposed": lambda x: x.t(),
    "strided": lambda x: x[::2, 1::3],
    "expanded": lambda x: x[:1].expand(4, -1),
    "element": lambda x: x[2, 3],
    "flat": lambda x: x.reshape(-1),
    "bytes": lambda x: x.view(torch.uint8)[1:, 2:],
    "conjugate": lambda x: x.conj()[1:],
    "negative": lambda x: torch._neg_view(x)[1:] if x.dtype.is_complex else x[1:],
}

READS = {
    "cpu": lambda t: t.cpu(),
    "to float64": lambda t: t.to("cpu", torch.float64) if not t.dtype.is_complex else t.cpu(),
    "copy_": lambda t: torch.empty(t.shape, dtype=t.dtype).copy_(t),
    "item": lambda t: t.reshape(-1)[-1].item(),
}


def _source(dtype: torch.dtype) -> torch.Tensor:
    values = torch.arange(-20, 28, dtype=torch.float64).reshape(4, 12) / 3
    if dtype.is_complex:
        return torch.complex(values, -values).to(dtype)
    return values.to(dtype) if dtype.is_floating_point else (values * 3 % 7).to(dtype)


def _executables_built() -> int:
    stats = torch.tpu.compilation_cache_stats()
    return stats["xla_compiles"] + stats["disk_hits"]


@pytest.mark.parametrize("mode", ["strict", "fused"])
@pytest.mark.parametrize("read", READS)
@pytest.mark.parametrize("view", VIEWS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_a_view_read_to_the_host_equals_cpus(dtype, view, read, mode):
    source = _source(dtype)
    computed = (lambda x: x.logical_not().logical_not()) if dtype == torch.bool else (lambda x: x * 1)
    expected = READS[read](VIEWS[view](computed(source)))
    with torch_tpu.eager_mode(mode):
        got = READS[read](VIEWS[view](computed(source.to("tpu"))))  # (fused: a pending value's view)
    if isinstance(expected, torch.Tensor):
        assert got.dtype == expected.dtype and got.shape == expected.shape
        assert torch.equal(got, expected)
    else:
        assert type(got) is type(expected) and got == expected


def test_views_of_new_geometries_read_to_the_host_compile_nothing():
    """A generated sequence of each length in its bucket, ``x[:n]`` for each ``n``."""
    x = torch.arange(64, device="tpu") * 3
    x[:3].cpu()  # (the storage's first host read)
    before = _executables_built()
    for n in range(30, 40, 2):
        assert x[:n].tolist() == list(range(0, 3 * n, 3))
        assert torch.equal(x[n:].view(2, -1)[:, ::2].cpu(), torch.arange(3 * n, 192, 3).view(2, -1)[:, ::2])
        assert x[n].item() == 3 * n
    assert _executables_built() == before


def test_bfloat16_tensors_cross_to_and_from_the_device_without_a_program():
    shapes = [(n, 7) for n in range(11, 16)]  # (shapes no other test moves)
    hosts = [torch.randn(shape, dtype=torch.bfloat16) for shape in shapes]
    hosts[0][0, :3] = torch.tensor([float("nan"), float("inf"), -0.0])
    torch.ones(1, dtype=torch.bfloat16).to("tpu").cpu()  # (the first transfer's own setup)
    before = _executables_built()
    devices = [host.to("tpu") for host in hosts]
    back = [device.cpu() for device in devices]
    assert _executables_built() == before
    for host, device, copied in zip(hosts, devices, back):
        assert device.dtype == torch.bfloat16 and device.shape == host.shape
        assert torch.equal(copied.view(torch.int16), host.view(torch.int16))  # (bit for bit)


def test_a_view_of_a_storage_over_the_limit_is_read_on_the_device(monkeypatch):
    x = _source(torch.float32).to("tpu")
    view = x[1:, ::2]
    assert tpu_tensor.read_on_host(view) is not None
    monkeypatch.setattr(tpu_tensor, "WHOLE_HOST_READ_BYTES", x.untyped_storage().nbytes() - 1)
    assert tpu_tensor.read_on_host(view) is None
    assert torch.equal(view.cpu(), _source(torch.float32)[1:, ::2])


def test_a_tensor_that_is_its_whole_storage_is_read_as_before():
    x = _source(torch.int64).to("tpu")
    assert tpu_tensor.read_on_host(x) is None
    assert torch.equal(x.cpu(), _source(torch.int64))
