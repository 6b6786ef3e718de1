"""fbgemm's sparse ops on tpu (``integrations.fbgemm``) against fbgemm's CPU kernels: the
jagged-tensor ops TorchRec calls, int32 and int64, with weights and without, permutations that
reorder, repeat and drop features. Runs where fbgemm is installed (scripts/install_rec.sh)."""

from __future__ import annotations

import pytest
import torch

import torch_tpu  # noqa: F401

pytest.importorskip("fbgemm_gpu", reason="fbgemm is not installed (scripts/install_rec.sh)")
fbgemm = torch.ops.fbgemm


def _flat(result):
    return result if isinstance(result, (tuple, list)) else (result,)


def _alike(op, *args):
    """``op`` on tpu gives fbgemm's CPU results, dtype and shape included (exactly: these ops
    move and add integers, or gather floats)."""
    expected = op(*args)
    got = op(*[a.to("tpu") if isinstance(a, torch.Tensor) else a for a in args])
    for e, g in zip(_flat(expected), _flat(got), strict=True):
        if e is None:
            assert g is None
            continue
        assert g.device.type == "tpu" and g.dtype == e.dtype and g.shape == e.shape
        torch.testing.assert_close(g.cpu(), e, rtol=0, atol=0)


INTS = [torch.int32, torch.int64]


@pytest.mark.parametrize("dtype", INTS, ids=str)
@pytest.mark.parametrize("name", ["complete", "inclusive", "exclusive"])
def test_cumsums(name, dtype):
    lengths = torch.tensor([2, 0, 3, 1, 0], dtype=dtype)
    _alike(getattr(fbgemm, f"asynchronous_{name}_cumsum"), lengths)


@pytest.mark.parametrize("dtype", INTS, ids=str)
def test_offsets_range(dtype):
    _alike(fbgemm.offsets_range, torch.tensor([0, 2, 2, 5], dtype=dtype), 7)


@pytest.mark.parametrize("dtype", INTS, ids=str)
@pytest.mark.parametrize("permute", [[2, 0, 1], [1, 1, 0], [2], [0, 1, 2]], ids=str)
@pytest.mark.parametrize("weighted", [False, True])
def test_permute_2d_sparse_data(permute, dtype, weighted):
    lengths = torch.tensor([[2, 1, 0], [1, 2, 3], [0, 1, 1]], dtype=dtype)
    values = torch.arange(11, dtype=dtype) * 7
    weights = torch.rand(11) if weighted else None
    order = torch.tensor(permute, dtype=torch.int32)
    _alike(fbgemm.permute_2D_sparse_data, order, lengths, values, weights, None)
    total = int(lengths[order.long()].sum())  # (given: no host read of the lengths)
    _alike(fbgemm.permute_2D_sparse_data, order, lengths, values, weights, total)


@pytest.mark.parametrize("dtype", INTS, ids=str)
def test_permute_1d_sparse_data(dtype):
    lengths = torch.tensor([2, 0, 3, 1], dtype=dtype)
    values = torch.arange(6, dtype=dtype)
    _alike(
        fbgemm.permute_1D_sparse_data,
        torch.tensor([3, 0, 2, 2], dtype=torch.int32),
        lengths,
        values,
        torch.rand(6),
    )


@pytest.mark.parametrize("name", ["permute_pooled_embs", "permute_pooled_embs_auto_grad"])
def test_permute_pooled_embs(name):
    pooled = torch.randn(3, 10)
    offsets, permute = torch.tensor([0, 4, 6, 10]), torch.tensor([2, 0, 1])
    inverse_offsets, inverse = torch.tensor([0, 4, 8, 10]), torch.tensor([1, 2, 0])
    _alike(getattr(fbgemm, name), pooled, offsets, permute, inverse_offsets, inverse)


def test_permute_pooled_embs_backward_is_fbgemms():
    """fbgemm's Autograd kernel wraps the tpu one: the gradient is the inverse permutation."""
    offsets, permute = torch.tensor([0, 4, 6, 10]), torch.tensor([2, 0, 1])
    inverse_offsets, inverse = torch.tensor([0, 4, 8, 10]), torch.tensor([1, 2, 0])
    grads = []
    for device in ("cpu", "tpu"):
        pooled = torch.randn(3, 10, generator=torch.Generator().manual_seed(0)).to(device).requires_grad_()
        lists = [x.to(device) for x in (offsets, permute, inverse_offsets, inverse)]
        out = fbgemm.permute_pooled_embs_auto_grad(pooled, *lists)
        (out * torch.arange(10.0, device=device)).sum().backward()
        grads.append(pooled.grad.cpu())
    torch.testing.assert_close(grads[1], grads[0], rtol=0, atol=0)


# ----------------------------------------------------------------------------- jagged <-> dense
OFFSETS = torch.tensor([0, 2, 2, 6, 7])  # 4 rows: 2, 0, 4 (cut at 3 below) and 1 values


def _on(device, x):
    if isinstance(x, list):
        return [_on(device, a) for a in x]
    return x.to(device) if isinstance(x, torch.Tensor) else x


def _backward_alike(op, values, *args):
    """``op``'s result and its gradient wrt ``values`` (fbgemm's Autograd kernel, the tpu
    lowerings of its backward) equal CPU's."""
    results = []
    for device in ("cpu", "tpu"):
        leaf = values.detach().to(device).requires_grad_()
        out = op(leaf, *_on(device, list(args)))
        out = out[0] if isinstance(out, (tuple, list)) else out
        weights = torch.arange(out.numel(), dtype=out.dtype).reshape(out.shape).to(device)
        (out * weights).sum().backward()
        results.append((out.detach().cpu(), leaf.grad.cpu()))
    for got, expected in zip(results[1], results[0], strict=True):
        torch.testing.assert_close(got, expected, rtol=0, atol=0)


def test_jagged_to_padded_dense_and_back():
    values = torch.randn(7, 3)
    _backward_alike(fbgemm.jagged_to_padded_dense, values, [OFFSETS], [3], -1.5)
    _backward_alike(fbgemm.jagged_2d_to_dense, values, OFFSETS, 3)
    _alike(fbgemm.jagged_1d_to_dense, torch.arange(7), OFFSETS, 3, -1)


def test_dense_to_jagged():
    dense = torch.randn(4, 5, 2)
    _backward_alike(fbgemm.dense_to_jagged, dense, [OFFSETS])
    _backward_alike(fbgemm.dense_to_jagged, dense, [OFFSETS], 7)


def test_nested_jagged_dimensions_are_refused_by_name():
    values = torch.randn(7, 3, device="tpu")
    inner = torch.tensor([0, 1, 3], device="tpu")
    with pytest.raises(
        NotImplementedError, match="jagged_to_padded_dense_forward on tpu: one jagged dimension only"
    ):
        fbgemm.jagged_to_padded_dense(values, [inner, OFFSETS.to("tpu")], [2, 3])


@pytest.mark.parametrize("sequence", [False, True])
@pytest.mark.parametrize("weighted", [False, True])
def test_block_bucketize_sparse_features(sequence, weighted):
    # 2 features x a batch of 2 (one bag empty), blocks of 5 over 2 ranks; 12 and 23 lie past
    # the blocks and go to rank id % 2
    lengths, indices = torch.tensor([2, 1, 4, 0]), torch.tensor([1, 7, 3, 9, 2, 12, 23])
    weights = torch.linspace(0.1, 0.7, 7) if weighted else None
    args = (True, sequence, torch.tensor([5, 5]), 2)
    expected = torch.ops.fbgemm.block_bucketize_sparse_features(lengths, indices, *args, weights)
    got = torch.ops.fbgemm.block_bucketize_sparse_features(
        lengths.to("tpu"), indices.to("tpu"), args[0], args[1], args[2].to("tpu"), 2,
        None if weights is None else weights.to("tpu"),
    )  # fmt: skip
    for g, e in zip(got, expected):
        assert (g is None) == (e is None)
        if e is not None:
            assert g.device.type == "tpu" and torch.equal(g.cpu(), e), (g, e)


def _torchrec_ops():
    """TorchRec's own tpu-kernel ops (defined by its experimental tpu package) and sample calls."""
    pytest.importorskip("torchrec.experimental.torch_tpu.pallas.ops")
    w, ids, offsets = torch.randn(10, 16), torch.tensor([1, 7, 3, 3, 9, 0]), torch.tensor([0, 2, 2, 5])
    grad_rows, grad_bags = torch.randn(6, 16), torch.randn(3, 16)
    # (stacked tables: bag b's rows from row_offsets[b])
    stacked, row_offsets = torch.randn(14, 16), torch.tensor([0, 2, 4])
    cols = (torch.tensor([0, 4, 10, 16]), torch.tensor([2, 0, 1]))
    return {
        "embedding_lookup": (ids, w, 16),
        "embedding_lookup_backward": (grad_rows, ids, 10, 16),
        "embedding_pooled_lookup": (ids, w, 2),
        "embedding_pooled_lookup_backward": (grad_bags, ids, 2, 10, 16),
        "embedding_pooled_lookup_offset": (ids[:5], offsets, w, 16),
        "embedding_pooled_lookup_offset_backward": (grad_bags, ids[:5], offsets, 10, 16),
        "embedding_pooled_batched_lookup_offset": (ids[:5], offsets, stacked, row_offsets, 16),
        "embedding_pooled_batched_lookup_offset_backward": (grad_bags, ids[:5], offsets, row_offsets, 14, 16),
        "permute_pooled_embs": (grad_bags, *cols),
        "permute_pooled_embs_backward": (grad_bags, *cols),
    }


@pytest.mark.parametrize(
    "name",
    [
        "embedding_lookup", "embedding_lookup_backward", "embedding_pooled_lookup",
        "embedding_pooled_lookup_backward", "embedding_pooled_lookup_offset",
        "embedding_pooled_lookup_offset_backward", "embedding_pooled_batched_lookup_offset",
        "embedding_pooled_batched_lookup_offset_backward", "permute_pooled_embs",
        "permute_pooled_embs_backward",
    ],
)  # fmt: skip
def test_torchrec_tpu_kernel_ops_as_on_cpu(name):
    args = _torchrec_ops()[name]
    op = getattr(torch.ops.torchrec, name)
    expected = op(*args)
    got = op(*(a.to("tpu") if isinstance(a, torch.Tensor) else a for a in args))
    assert got.device.type == "tpu"
    torch.testing.assert_close(got.cpu(), expected, rtol=1.3e-6, atol=1e-5)
