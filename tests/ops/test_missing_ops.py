"""Ops real models reached that tpu did not lower: histograms, segment_reduce, the deprecated
``_aminmax`` and sparse COO conversions, each compared with CPU (values, gradients, errors)."""

from __future__ import annotations

import itertools

import pytest
import torch
from torch.utils import _pytree

import torch_tpu


def _tpu(tree):
    return _pytree.tree_map(lambda x: x.to("tpu") if isinstance(x, torch.Tensor) else x, tree)


def _same_as_cpu(fn, *args, **kwargs):
    expected = fn(*args, **kwargs)
    actual = fn(*_tpu(args), **_tpu(kwargs))
    torch.testing.assert_close(_pytree.tree_map(lambda x: x.cpu(), actual), expected, equal_nan=True)


def _same_error(fn):
    errors = []
    for device in ("cpu", "tpu"):
        with pytest.raises(Exception) as error:  # noqa: PT011  (compared with CPU's below)
            fn(device)
        errors.append((type(error.value), str(error.value)))
    assert errors[1] == errors[0]


X = torch.randn(50, generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize(
    ("args", "kwargs"),
    [
        ((X, 7), {}),
        ((X, 7), {"range": (-1.0, 1.0)}),
        ((X, 7), {"weight": X.abs(), "density": True}),
        ((X.reshape(5, 10), torch.tensor([-1.0, 0.0, 0.5, 2.0])), {"weight": X.reshape(5, 10).abs()}),
        ((X.double(), torch.tensor([-1.0, 0.0, 0.5, 2.0]).double()), {"density": True}),
        ((torch.tensor([3.0, 3.0]), 2), {}),  # one value: the range widened by 0.5
        ((torch.zeros(0), 2), {}),  # no values: range [0, 1]
    ],
)
def test_histogram(args, kwargs):
    _same_as_cpu(torch.histogram, *args, **kwargs)


@pytest.mark.parametrize(
    ("args", "kwargs"),
    [
        ((X[:30].reshape(15, 2), [3, 4]), {}),
        (
            (X[:30].reshape(10, 3), [3, 4, 2]),
            {"range": [-1.0, 1, -2, 2, 0, 1], "weight": X[:10], "density": True},
        ),
        ((X[:30].reshape(3, 5, 2), [torch.tensor([-1.0, 0.0, 1.0]), torch.tensor([-2.0, 2.0])]), {}),
        ((X[:30].reshape(3, 5, 2), 3), {}),
    ],
)
def test_histogramdd(args, kwargs):
    _same_as_cpu(torch.histogramdd, *args, **kwargs)


@pytest.mark.parametrize(
    "call",
    [
        lambda d: torch.histogram(torch.tensor([1.0, float("inf")], device=d), 3),
        lambda d: torch.histogram(torch.tensor([1.0, float("nan")], device=d), 3),
        lambda d: torch.histogram(torch.randn(10, device=d), 3, weight=torch.ones(3, device=d)),
        lambda d: torch.histogram(
            torch.randn(10, device=d), torch.tensor([0.0, 1.0], dtype=torch.float64, device=d)
        ),
        lambda d: torch.histogram(torch.randn(10, device=d), torch.zeros(0, device=d)),
        lambda d: torch.histogramdd(torch.randn(5, 2, device=d), [3, 0]),
        lambda d: torch.histogram(torch.randn(10, device=d), 3, range=(1.0, 0.0)),
        lambda d: torch.histogramdd(torch.randn(5, 2, device=d), [3, 2], range=[0.0, 1.0]),
    ],
)
def test_histogram_errors(call):
    _same_error(lambda d: _pytree.tree_map(lambda x: x.cpu(), call(d)))


def test_histogram_refuses_integers_as_cpu():
    """(The dtype refusal names the op, ``histogram``; CPU's names its kernel, ``histogramdd``.)"""
    for device in ("cpu", "tpu"):
        with pytest.raises(NotImplementedError, match="not implemented for 'Long'"):
            torch.histogram(torch.arange(3, device=device), 3)


_DATA = torch.randn(2, 6, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
_DATA[0, 1, 0] = _DATA[0, 0, 0]  # a tie for max/min
_DATA[1, 2, 1] = 0.0  # a zero for prod
_LENGTHS = torch.tensor([[2, 0, 4], [1, 3, 2]])  # an empty segment
_OFFSETS = torch.cat([torch.zeros(2, 1, dtype=torch.long), _LENGTHS.cumsum(1)], 1)


@pytest.mark.parametrize(
    ("reduce", "segments", "initial"),
    itertools.product(["sum", "mean", "max", "min", "prod"], ["lengths", "offsets"], [None, 1.5]),
)
def test_segment_reduce_forward_and_backward(reduce, segments, initial):
    kwargs = {segments: _LENGTHS if segments == "lengths" else _OFFSETS, "axis": 1, "initial": initial}
    results = []
    for device in ("cpu", "tpu"):
        data = _DATA.to(device).requires_grad_()
        out = torch.segment_reduce(data, reduce, **_tpu(kwargs) if device == "tpu" else kwargs)
        cotangent = torch.randn(out.shape, dtype=out.dtype, generator=torch.Generator().manual_seed(1))
        (grad,) = torch.autograd.grad(out, data, cotangent.to(device))
        results.append((out.detach().cpu(), grad.cpu()))
    torch.testing.assert_close(results[1], results[0], equal_nan=True)


@pytest.mark.parametrize("lengths", [[2, -1, 5], [2, 2]])
def test_segment_reduce_checks_lengths(lengths):
    _same_error(
        lambda d: torch.segment_reduce(
            torch.arange(6.0, device=d), "sum", lengths=torch.tensor(lengths, device=d)
        ).cpu()
    )


@pytest.mark.filterwarnings("ignore:_aminmax is deprecated")
def test_deprecated_aminmax():
    x = torch.randn(3, 4)
    _same_as_cpu(torch._aminmax, x)
    _same_as_cpu(torch._aminmax, x, 1, True)
    _same_as_cpu(torch._aminmax, torch.zeros(0, 3), 1)
    _same_error(lambda d: torch._aminmax(torch.zeros(0, 3, device=d)))


@pytest.mark.filterwarnings("ignore:Sparse invariant checks")
@pytest.mark.parametrize("sparse_dim", [None, 1, 2])
def test_sparse_coo_round_trip(sparse_dim):
    """Dense to COO and back, and COO tensors moved between CPU and tpu; tpu's indices and
    values are dense tpu tensors."""
    x = torch.tensor([[0.0, 1.0, 0.0], [2.0, 0.0, 3.0]])
    expected = x.to_sparse() if sparse_dim is None else x.to_sparse(sparse_dim)
    actual = x.to("tpu").to_sparse() if sparse_dim is None else x.to("tpu").to_sparse(sparse_dim)
    assert (actual.layout, actual.device.type, actual._values().device.type) == (
        torch.sparse_coo,
        "tpu",
        "tpu",
    )
    assert actual.is_coalesced() and actual.sparse_dim() == expected.sparse_dim()
    torch.testing.assert_close(actual._indices().cpu(), expected._indices())
    torch.testing.assert_close(actual._values().cpu(), expected._values())
    torch.testing.assert_close(actual.to_dense().cpu(), x)
    torch.testing.assert_close(actual.cpu().to_dense(), x)
    uncoalesced = torch.sparse_coo_tensor(
        torch.tensor([[0, 1, 0], [1, 0, 1]]), torch.tensor([1.0, 2.0, 4.0]), (2, 2)
    )
    torch.testing.assert_close(uncoalesced.to("tpu").to_dense().cpu(), uncoalesced.to_dense())


@pytest.mark.filterwarnings("ignore:Sparse invariant checks")
def test_sparse_kernels_are_not_lowered(monkeypatch):
    """Sparse arithmetic has no tpu lowering: a NotImplementedError naming the op, or with the
    opt-in fallback a CPU round trip that is counted."""
    from torch_tpu import config

    sparse = torch.tensor([[0.0, 1.0], [2.0, 0.0]]).to_sparse()
    ones = torch.ones(2, 2)
    with pytest.raises(NotImplementedError, match="'aten::addmm' has no tpu lowering for sparse tensors"):
        torch.sparse.mm(sparse.to("tpu"), ones.to("tpu"))
    from torch_tpu.ops import dispatch

    monkeypatch.setattr(config, "cpu_fallback", True)
    # (the counts are a process-wide report: other tests expect them as they were)
    monkeypatch.setattr(dispatch.recording, "cpu_fallback_counts", dispatch.cpu_fallback_counts.copy())
    before = torch_tpu.cpu_fallback_counts().get("aten::addmm", 0)
    result = torch.sparse.mm(sparse.to("tpu"), ones.to("tpu"))
    torch.testing.assert_close(result.cpu(), torch.sparse.mm(sparse, ones))
    assert torch_tpu.cpu_fallback_counts()["aten::addmm"] == before + 1
