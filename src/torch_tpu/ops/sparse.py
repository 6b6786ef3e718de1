"""Sparse COO tensors on tpu, as on CUDA: PyTorch's own sparse TensorImpl (dispatch key
SparsePrivateUse1) whose indices and values are dense tpu tensors.

Only conversions are native: dense to COO (``to_sparse``: ``nonzero`` and a gather on tpu),
COO to dense (``to_dense``: a scatter-add on tpu), moving COO tensors between CPU and tpu, and
the accessors those need (PyTorch's device-independent kernels, which only read and write the
sparse TensorImpl's fields). Every other sparse kernel (sparse matmul, coalesce, sparse
arithmetic) has no tpu lowering: it raises ``NotImplementedError`` naming the op, or with
``TORCH_TPU_CPU_FALLBACK=1`` runs on CPU, counted in ``torch_tpu.cpu_fallback_counts()`` like
any op without a lowering.
"""

from __future__ import annotations

import torch

from .registry import runtime

aten = torch.ops.aten

#: Kernels that only build or read a sparse TensorImpl, whatever the device of its tensors.
_FIELD_KERNELS = (
    "_sparse_coo_tensor_with_dims_and_tensors",
    "_indices",
    "_values",
    "indices",
    "values",
    "_nnz",
    "sparse_dim",
    "dense_dim",
    "is_coalesced",
    "_coalesced_",
)
_SPARSE_CPU = torch._C.DispatchKeySet(torch._C.DispatchKey.SparseCPU)


def _coo(x: torch.Tensor, sparse_dim: int) -> torch.Tensor:
    """CPU's dense-to-COO: the positions of the sparse dimensions holding any nonzero, in
    row-major order (so coalesced), and their dense slices."""
    dense_dims = tuple(range(sparse_dim, x.dim()))
    mask = x != 0
    if dense_dims:
        mask = mask.any(dense_dims)
    indices = mask.nonzero().t().contiguous()
    values = x[tuple(indices)] if sparse_dim else x.reshape(1)[: indices.shape[1]]  # 0-d: nnz 0 or 1
    return aten._sparse_coo_tensor_with_dims_and_tensors(
        sparse_dim, x.dim() - sparse_dim, x.shape, indices, values,
        dtype=x.dtype, layout=torch.sparse_coo, device=x.device, is_coalesced=True,
    )  # fmt: skip


@runtime(aten._to_sparse.default)
def to_sparse(x, layout=None, blocksize=None, dense_dim=None):
    if layout not in (None, torch.sparse_coo) or blocksize is not None:
        raise NotImplementedError(f"tpu has sparse COO tensors only, not {layout}")
    return _coo(x, x.dim() - (dense_dim or 0))


@runtime(aten._to_sparse.sparse_dim)
def to_sparse_dim(x, sparse_dim):
    if not 0 <= sparse_dim <= x.dim():
        raise RuntimeError(
            f"dense_to_sparse: sparse_dim argument must be in [0,{x.dim()}] range, but {sparse_dim} is given"
        )
    if sparse_dim == 0 and x.dim():
        raise RuntimeError("dense_to_sparse: sparse_dim argument must be in >0 when self.dim()>0")
    return _coo(x, sparse_dim)


def _to_dense(x: torch.Tensor, dtype=None, masked_grad=None) -> torch.Tensor:
    out = torch.zeros(x.shape, dtype=x.dtype, device=x.device)
    out.index_put_(tuple(x._indices()), x._values(), accumulate=True)
    return out if dtype is None else out.to(dtype)


def _field_kernel(op: torch._ops.OpOverload):
    return lambda *args, **kwargs: op.redispatch(_SPARSE_CPU, *args, **kwargs)


_libraries: list[torch.library.Library] = []


def install(fallback) -> None:
    """The sparse kernels on SparsePrivateUse1; ``fallback`` handles every other sparse op."""
    kernels, others = torch.library.Library("aten", "IMPL"), torch.library.Library("_", "IMPL")
    _libraries.extend((kernels, others))
    for name in _FIELD_KERNELS:
        kernels.impl(name, _field_kernel(getattr(aten, name).default), "SparsePrivateUse1")
    kernels.impl("_to_dense", _to_dense, "SparsePrivateUse1")
    others.fallback(fallback, "SparsePrivateUse1")
