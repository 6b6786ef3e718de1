"""The tpu data model against CPU: views and aliasing, writes through views, autograd over views,
dtype reinterpretation, host transfers, printing and dtype support.

Every case runs the same code on a CPU tensor and on its tpu copy and requires the same values,
geometry (shape, strides, offset) and aliasing (which results share their base's storage).
"""

from __future__ import annotations

import gc
import re

import jax
import pytest
import torch

import torch_tpu
from torch_tpu.runtime import buffer as _buffer
from torch_tpu.runtime.host_copies import host_copy


@pytest.fixture(autouse=True, params=["strict", "fused"])
def eager_mode(request):
    """Every test here runs in strict and in fused eager (ops deferred into graphs)."""
    with torch_tpu.eager_mode(request.param):
        yield


TPU = torch.device("tpu")


def _base(shape=(3, 4), dtype=torch.float32) -> torch.Tensor:
    """A fresh tensor (not itself a view), counting up from 0."""
    return torch.arange(int(torch.tensor(shape).prod()), dtype=dtype).reshape(shape).clone()


def _shares_storage(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.untyped_storage()._cdata == b.untyped_storage()._cdata


def assert_same(tpu: torch.Tensor, cpu: torch.Tensor) -> None:
    """Same dtype, shape and values, bit for bit (NaNs included)."""
    assert tpu.device.type == "tpu"
    assert tpu.dtype == cpu.dtype and tpu.shape == cpu.shape
    host = tpu.cpu()
    if cpu.dtype.is_complex:
        host, cpu = torch.view_as_real(host), torch.view_as_real(cpu)
    if cpu.dim() == 0:
        host, cpu = host.reshape(1), cpu.reshape(1)
    assert torch.equal(host.contiguous().view(torch.uint8), cpu.contiguous().view(torch.uint8)), (
        f"tpu {host}\n!= cpu {cpu}"
    )


def assert_same_view(
    tpu: torch.Tensor, tpu_base: torch.Tensor, cpu: torch.Tensor, cpu_base: torch.Tensor
) -> None:
    """Same values and the same geometry and aliasing as PyTorch's CPU view."""
    assert_same(tpu, cpu)
    assert tpu.stride() == cpu.stride()
    assert tpu.storage_offset() == cpu.storage_offset()
    assert tpu.is_contiguous() == cpu.is_contiguous()
    assert _shares_storage(tpu, tpu_base) == _shares_storage(cpu, cpu_base)
    assert (tpu._base is tpu_base) == (cpu._base is cpu_base)


# ----------------------------------------------------------------------------- views
VIEWS = {
    "slice": lambda x: x[1:3],
    "slice_step": lambda x: x[:, ::2],
    "slice_step_offset": lambda x: x[1:, 1::2],
    "negative_index": lambda x: x[-1],
    "negative_slice": lambda x: x[-2:, -3:-1],
    "ellipsis_none": lambda x: x[None, ..., 1, None],
    "view_flat": lambda x: x.view(12),
    "view_infer": lambda x: x.view(-1, 2),
    "view_as": lambda x: x.view_as(torch.empty(4, 3)),
    "reshape_is_view": lambda x: x.reshape(6, 2),
    "reshape_needs_copy": lambda x: x.t().reshape(12),
    "flatten": lambda x: x.flatten(),
    "unflatten": lambda x: x.unflatten(1, (2, 2)),
    "t": lambda x: x.t(),
    "T": lambda x: x.T,
    "mT": lambda x: x.mT,
    "transpose": lambda x: x.transpose(0, 1),
    "permute_3d": lambda x: x.view(2, 3, 2).permute(2, 0, 1),
    "transpose_3d": lambda x: x.view(2, 3, 2).transpose(0, 2),
    "movedim": lambda x: x.view(2, 3, 2).movedim(0, -1),
    "expand": lambda x: x[:1].expand(3, 4),
    "expand_new_dim": lambda x: x[0].expand(2, 4),
    "unfold": lambda x: x.unfold(1, 2, 1),
    "unfold_step": lambda x: x.unfold(1, 2, 2),
    "as_strided": lambda x: x.as_strided((2, 2), (1, 4), 1),
    "as_strided_overlap": lambda x: x.as_strided((3, 3), (1, 1)),
    "diagonal": lambda x: x.diagonal(),
    "diagonal_offset": lambda x: x.diagonal(offset=1),
    "diagonal_negative": lambda x: x.diagonal(offset=-1),
    "select": lambda x: x.select(1, 2),
    "narrow": lambda x: x.narrow(1, 1, 2),
    "unsqueeze": lambda x: x.unsqueeze(1),
    "squeeze": lambda x: x.unsqueeze(0).unsqueeze(-1).squeeze(),
    "split": lambda x: x.split(3, dim=1)[1],
    "chunk": lambda x: x.chunk(2, dim=0)[1],
    "unbind": lambda x: x.unbind(1)[3],
    "chained": lambda x: x.t()[1:, ::2].unsqueeze(0).expand(2, 3, 2),
    "view_of_slice": lambda x: x[1:].view(2, 2, 2),
    "contiguous_of_view": lambda x: x.t().contiguous(),
    "contiguous_is_noop": lambda x: x.contiguous(),
    "clone_of_view": lambda x: x.t().clone(),
}


@pytest.mark.parametrize("name", VIEWS)
def test_view_matches_cpu(name):
    cpu_base = _base()
    tpu_base = cpu_base.to(TPU)
    fn = VIEWS[name]
    assert_same_view(fn(tpu_base), tpu_base, fn(cpu_base), cpu_base)


@pytest.mark.parametrize(
    ("call", "reads_apart"),
    [
        (lambda x, w: torch.nn.functional.linear(x, w), 0),  # w.t(): the matmul reads it transposed
        (lambda x, w: w.t() * 2 + w.t(), 0),
        (lambda x, w: x.reshape(4, 2, 8).transpose(0, 1).sum(0), 0),
        (lambda x, w: w.t().mul_(3), 0),  # written through the transposed view
        (lambda x, w: w[1:].t() * 2, 1),  # a slice: not the whole storage, read apart in strict
        (lambda x, w: x.reshape(8, 8) * 2, 1),  # a reshape: read apart, shared by every op
    ],
    ids=["linear", "elementwise", "reduction", "inplace", "slice", "reshape"],
)
def test_strict_ops_read_a_permuted_storage_in_their_program(call, reads_apart, monkeypatch):
    """Strict eager reads a view that is its whole storage transposed inside the op's program
    (no copy of a linear layer's weight), other views apart; results and aliasing as on CPU."""
    from torch_tpu.runtime import tensor

    x, w = torch.randn(4, 16), torch.randn(32, 16)
    tx, tw = x.to(TPU), w.to(TPU)
    strict = torch_tpu.get_eager_mode() == torch_tpu.EagerMode.STRICT  # (fused reads all in nodes)
    reads = []
    if strict:
        read = tensor._strided_read
        monkeypatch.setattr(tensor, "_strided_read", lambda *a: reads.append(1) or read(*a))
    result = call(tx, tw)
    assert not strict or len(reads) == reads_apart
    monkeypatch.undo()
    torch.testing.assert_close(result.cpu(), call(x, w))
    torch.testing.assert_close(tw.cpu(), w)  # (written through its view as on CPU)


def test_views_in_a_tensor_list_are_read_inside_their_ops_node():
    """Fused eager hands a list's views (``cat``'s tensors, a foreach op's, whose check counts
    them: transposed, sliced at an offset, reshaped) to the op's node as their storages' arrays
    and geometry: one node for the op, none per view."""
    from torch_tpu import execution

    x, w = torch.randn(4, 6), torch.randn(6, 4)
    tx, tw = x.to(TPU), w.to(TPU)
    torch_tpu.sync()
    fused = torch_tpu.get_eager_mode() == torch_tpu.EagerMode.FUSED
    pending = execution.pending_ops()
    result = torch.cat([tx, tw.t(), tx[1:]])
    assert not fused or execution.pending_ops() == pending + 1
    torch.testing.assert_close(result.cpu(), torch.cat([x, w.t(), x[1:]]))
    pending = execution.pending_ops()
    results = torch._foreach_add([tw.t(), tx[1:], tx.view(6, 4)], [tx, tx[:3], tw], alpha=2)
    assert not fused or execution.pending_ops() == pending + 1
    expected = torch._foreach_add([w.t(), x[1:], x.view(6, 4)], [x, x[:3], w], alpha=2)
    for result, want in zip(results, expected):
        torch.testing.assert_close(result.cpu(), want)


def test_a_storage_read_whole_in_another_shape_keeps_that_shape(monkeypatch):
    """A tensor that is all of its storage's array in another shape (a bias's gradient, summed
    with keepdim then viewed flat) is read apart once: the storage then holds the value in the
    tensor's shape, which its next reads take as it is. The other shape reads the same values;
    a storage with a host copy (a batch of indices) keeps its own array, and with it the copy."""
    from torch_tpu.runtime import tensor

    base = torch.arange(6.0, device=TPU).reshape(1, 6) * 1  # its own (1, 6) array
    index = torch.tensor([[1, 2]]).to(TPU)
    torch_tpu.sync()
    flat, flat_index = base.view(6), index.view(2)
    reads = []
    read_apart = tensor._read_apart
    monkeypatch.setattr(tensor, "_read_apart", lambda *a: reads.append(1) or read_apart(*a))
    positions = torch.tensor([5, 0], device=TPU)
    for _ in range(3):  # (an op with a check: its input is read apart in both modes)
        result = flat.index_select(0, positions)
    assert len(reads) == 1
    assert _buffer.get(flat.untyped_storage()).shape == (6,)
    flat_index.index_select(0, positions[1:])
    assert _buffer.get(index.untyped_storage()).shape == (1, 2)
    monkeypatch.undo()
    torch.testing.assert_close(result.cpu(), torch.tensor([5.0, 0.0]))
    torch.testing.assert_close((base + 1).cpu(), torch.arange(6.0).reshape(1, 6) + 1)
    assert host_copy(_buffer.get(index.untyped_storage())) is not None


def test_view_as_real_and_complex():
    cpu = torch.complex(_base(), -_base())
    tpu = cpu.to(TPU)
    assert_same_view(torch.view_as_real(tpu), tpu, torch.view_as_real(cpu), cpu)
    real_cpu, real_tpu = _base((3, 2, 2)), _base((3, 2, 2)).to(TPU)
    assert_same_view(torch.view_as_complex(real_tpu), real_tpu, torch.view_as_complex(real_cpu), real_cpu)
    torch.view_as_real(tpu)[1, 2, 1] = 100  # writes the imaginary part of tpu[1, 2]
    torch.view_as_real(cpu)[1, 2, 1] = 100
    assert_same(tpu, cpu)


BITCASTS = [  # (source dtype, target dtype): x.view(dtype) reinterprets the bytes
    (torch.float32, torch.int32),
    (torch.int32, torch.float32),
    (torch.float32, torch.bfloat16),
    (torch.bfloat16, torch.float32),
    (torch.float32, torch.int16),
    (torch.int16, torch.float32),
    (torch.float32, torch.uint8),
    (torch.uint8, torch.float32),
    (torch.int64, torch.float64),
    (torch.float64, torch.int64),
    (torch.float16, torch.int16),
    (torch.bfloat16, torch.float16),
    (torch.int8, torch.uint8),
    (torch.uint8, torch.int8),
    (torch.bool, torch.uint8),
    (torch.uint8, torch.bool),
    (torch.complex64, torch.float32),
    (torch.float32, torch.complex64),
    (torch.int64, torch.int32),
    (torch.complex64, torch.int64),
    (torch.complex128, torch.float64),
    (torch.float64, torch.complex128),
    (torch.complex128, torch.int32),
    (torch.float32, torch.complex128),
    (torch.uint16, torch.int16),
    (torch.int8, torch.uint16),
    (torch.uint32, torch.float32),
    (torch.uint64, torch.complex64),
]


def _bit_pattern_source(dtype: torch.dtype) -> torch.Tensor:
    """8 x 8 values with varied bit patterns (0/1 only for bool, so every byte is a valid bool)."""
    if dtype == torch.bool:
        return torch.arange(64).reshape(8, 8) % 3 == 0
    values = torch.linspace(-300.5, 300.25, 64, dtype=torch.float64).reshape(8, 8)
    if dtype.is_complex:
        return torch.complex(values, values.flip(1)).to(dtype)
    if dtype.is_floating_point:
        return values.to(dtype)
    info = torch.iinfo(dtype)
    return values.to(torch.int64).clamp(int(info.min), min(int(info.max), 2**63 - 1)).to(dtype)


@pytest.mark.parametrize("source,target", BITCASTS, ids=lambda d: str(d).removeprefix("torch."))
def test_view_dtype_reinterprets_bits(source, target):
    cpu = _bit_pattern_source(source)
    if target == torch.bool:
        cpu = cpu % 2  # only 0/1 bytes are valid bools
    tpu = cpu.to(TPU)
    assert_same_view(tpu.view(target), tpu, cpu.view(target), cpu)
    assert_same_view(tpu[2:5].view(target), tpu, cpu[2:5].view(target), cpu)


def test_write_through_dtype_view_changes_bits_of_base():
    cpu, tpu = _base(), _base().to(TPU)
    for x in (cpu, tpu):
        x.view(torch.int32)[1] = 0x3F800000  # the bits of 1.0f
        x.view(torch.int16)[2, 1::2] = 0x4000  # high halves: 2.0f's upper bits
    assert_same(tpu, cpu)
    assert tpu[1].tolist() == [1.0] * 4


# ----------------------------------------------------------------------------- writes through views
def _values_like(x: torch.Tensor, values) -> torch.Tensor:
    return torch.tensor(values, dtype=x.dtype).to(x.device)


WRITES = {
    "row_add_": lambda x: x[0].add_(1),
    "transposed_row_mul_": lambda x: x.t()[1].mul_(10),
    "flat_view_zero_": lambda x: x.view(12)[5:8].zero_(),
    "column_copy_": lambda x: x[:, 1].copy_(_values_like(x, [7, 8, 9])),
    "step_setitem": lambda x: x.__setitem__(slice(None, None, 2), 5),
    "diagonal_fill_": lambda x: x.diagonal().fill_(-1),
    "unfold_mul_": lambda x: x.unfold(1, 2, 2).mul_(2),
    "select_neg_": lambda x: x.select(1, 3).neg_(),
    "narrow_sub_": lambda x: x.narrow(0, 1, 1).sub_(1),
    "as_strided_fill_": lambda x: x.as_strided((2, 2), (4, 1), 5).fill_(0),
    "unsqueeze_div_": lambda x: x.unsqueeze(0)[0, 2].div_(2),
    "transposed_block_setitem": lambda x: x[1:, 1:].transpose(0, 1).__setitem__(0, 3),
    "negative_slice_setitem": lambda x: x.__setitem__((-1, slice(-2, None)), _values_like(x, [-5, -6])),
    "flatten_step_add_": lambda x: x.flatten()[::3].add_(100),
    "reshape_view_add_": lambda x: x.reshape(12)[::5].add_(1),
    "reshape_copy_add_": lambda x: x.t().reshape(12).add_(1),  # a copy: base unchanged
    "contiguous_copy_add_": lambda x: x.t().contiguous().add_(1),  # a copy: base unchanged
    "clone_add_": lambda x: x.clone().add_(1),  # base unchanged
    "broadcast_copy_": lambda x: x[1:].copy_(_values_like(x, [1, 2, 3, 4])),
    "scalar_element_setitem": lambda x: x.__setitem__((2, 3), 42),
    "out_into_view": lambda x: torch.add(x[0], 1, out=x[2]),
    "chained_views_add_": lambda x: x.t()[1:, ::2].unsqueeze(0)[0].add_(0.5),
    "inplace_on_base_whole": lambda x: x.mul_(3),
}


@pytest.mark.parametrize("name", WRITES)
def test_write_through_view_matches_cpu(name):
    cpu, tpu = _base(), _base().to(TPU)
    WRITES[name](cpu)
    WRITES[name](tpu)
    assert_same(tpu, cpu)
    assert tpu._version == cpu._version


def test_write_to_base_is_visible_in_views():
    cpu, tpu = _base(), _base().to(TPU)
    views = [lambda x: x[1], lambda x: x.t()[::2], lambda x: x.diagonal(), lambda x: x.view(12)]
    cpu_views, tpu_views = [v(cpu) for v in views], [v(tpu) for v in views]
    for x in (cpu, tpu):
        x.add_(1)
        x[0, 0] = -7
    for tv, cv in zip(tpu_views, cpu_views):
        assert_same(tv, cv)
    tpu.copy_(torch.full((3, 4), 2.5))  # a whole-storage write replaces the storage value
    cpu.copy_(torch.full((3, 4), 2.5))
    for tv, cv in zip(tpu_views, cpu_views):
        assert_same(tv, cv)


def test_write_through_one_view_is_visible_in_another():
    cpu, tpu = _base(), _base().to(TPU)
    for x in (cpu, tpu):
        column, row = x[:, 2], x[1]
        column.mul_(-1)
        assert row[2].item() == -6.0
    assert_same(tpu, cpu)


# ----------------------------------------------------------------------------- overlapping writes
# Writes whose target shares memory with itself or with what they read, on a 3x4 base ``x``.
# CPU raises for what it can see ("partial" overlap of dense views, stride-0 targets) and
# computes the rest in its loop order.
def _flat(x: torch.Tensor) -> torch.Tensor:
    return x.view(12)


def _windows(x: torch.Tensor) -> torch.Tensor:
    """Overlapping 3-element windows of x's first 5 elements (each interior element in several)."""
    return x.view(12).as_strided((3, 3), (1, 1))


OVERLAP_ERRORS = {  # CPU raises; so must tpu, with CPU's message, writing nothing
    "copy_shifted_right": lambda x: _flat(x)[1:].copy_(_flat(x)[:-1]),
    "copy_shifted_left": lambda x: _flat(x)[:-1].copy_(_flat(x)[1:]),
    "copy_through_dtype_views": lambda x: (
        _flat(x).view(torch.int32)[2:].copy_(_flat(x).view(torch.int32)[:-2])
    ),
    "setitem_rows_shifted": lambda x: x.__setitem__(slice(1, None), x[:-1]),
    "copy_into_expanded": lambda x: x[:1].expand(3, 4).copy_(torch.ones(3, 4, device=x.device)),
    "out_shifted": lambda x: torch.add(_flat(x)[:-1], 1, out=_flat(x)[1:]),
    "unary_out_shifted": lambda x: torch.neg(_flat(x)[:-1], out=_flat(x)[1:]),
    "in_place_shifted": lambda x: _flat(x)[1:].add_(_flat(x)[:-1]),
    "in_place_ternary_shifted": lambda x: _flat(x)[1:].addcmul_(_flat(x)[:-1], _flat(x)[:-1]),
    "in_place_by_own_row": lambda x: x.mul_(x[0]),
    "in_place_by_own_element": lambda x: x.add_(x[1, 2]),
    "out_into_expanded": lambda x: torch.add(x[1], 1, out=x[0, :1].expand(4)),
    "in_place_on_expanded": lambda x: x[:1].expand(3, 4).add_(1),
    "foreach_shifted": lambda x: torch._foreach_add_([_flat(x)[1:]], [_flat(x)[:-1]]),
    "cat_out_is_input": lambda x: torch.cat([x[0]], out=x[0]),  # no overlap at all allowed
    "index_copy_from_itself": lambda x: x.index_copy_(0, torch.tensor([2, 1, 0], device=x.device), x),
}
OVERLAPS_ALLOWED = {  # CPU computes these, and its result is also the clone's: tpu matches it
    "in_place_with_itself": lambda x: x.add_(x),
    "in_place_with_same_view": lambda x: x[:2].add_(x[:2]),
    "out_is_the_input": lambda x: torch.mul(x, 2, out=x),
    "copy_itself": lambda x: x.copy_(x),
    "copy_interleaved": lambda x: _flat(x)[0::2].copy_(_flat(x)[1::2]),
    "copy_other_column": lambda x: x[:, 0].copy_(x[:, 1]),
    "in_place_by_other_column": lambda x: x[:, 1].add_(x[:, 0]),
    "setitem_columns_shifted_left": lambda x: x.__setitem__((slice(None), slice(None, -1)), x[:, 1:]),
    "copy_transposed_shifted_left": lambda x: x.t()[:-1].copy_(x.t()[1:]),
    "copy_first_column_everywhere": lambda x: x.copy_(x[:, :1]),
    "fill_expanded": lambda x: x[:1].expand(3, 4).fill_(7),
    "zero_expanded": lambda x: x[:1].expand(3, 4).zero_(),
    "fill_overlapping_windows": lambda x: _windows(x).fill_(-1),
}
ORDER_DEPENDENT = {  # CPU computes these in its loop order, not as a clone would: tpu refuses
    "setitem_columns_shifted_right": (
        lambda x: x.__setitem__((slice(None), slice(1, None)), x[:, :-1]),
        "input",
    ),
    "in_place_columns_shifted_right": (lambda x: x[:, 1:].add_(x[:, :-1]), "input"),
    "reduction_out_into_own_row": (lambda x: torch.sum(x, 0, out=x[1]), "input"),
    "in_place_on_overlapping_windows": (lambda x: _windows(x).add_(1), "written-to tensor"),
    "copy_into_overlapping_windows": (lambda x: _windows(x).copy_(torch.ones(3, 3)), "written-to tensor"),
    "in_place_on_overlapping_unfold": (lambda x: _flat(x).unfold(0, 3, 1).mul_(2), "written-to tensor"),
}
_OVERLAP_MESSAGES = {
    "input": "some elements of the input tensor and the written-to tensor refer to a single memory location",
    "written-to tensor": "more than one element of the written-to tensor refers to a single memory location",
}


@pytest.mark.parametrize("name", OVERLAP_ERRORS)
def test_overlapping_write_raises_like_cpu(name):
    cpu, tpu = _base(), _base().to(TPU)
    with pytest.raises(RuntimeError, match="single memory location") as cpu_error:
        OVERLAP_ERRORS[name](cpu)
    with pytest.raises(RuntimeError) as tpu_error:
        OVERLAP_ERRORS[name](tpu)
    assert str(tpu_error.value) == str(cpu_error.value)
    assert_same(tpu, _base())


@pytest.mark.parametrize("name", OVERLAPS_ALLOWED)
def test_overlapping_write_cpu_allows_matches_cpu(name):
    cpu, tpu = _base(), _base().to(TPU)
    OVERLAPS_ALLOWED[name](cpu)
    OVERLAPS_ALLOWED[name](tpu)
    assert_same(tpu, cpu)


@pytest.mark.parametrize("name", ORDER_DEPENDENT)
def test_overlapping_write_cpu_computes_in_loop_order_raises(name):
    fn, kind = ORDER_DEPENDENT[name]
    fn(_base())  # CPU does not raise
    tpu = _base().to(TPU)
    with pytest.raises(RuntimeError, match=f"^unsupported operation: {_OVERLAP_MESSAGES[kind]}"):
        fn(tpu)
    assert_same(tpu, _base())


# ----------------------------------------------------------------------------- copies between views
# ``x[...] = y[...]`` where ``y[...]`` is a view its own program would read: one program reads it
# and writes it into the part of x's storage (``tensor.write_view``). ``x`` is a 3x4 base, ``y``
# another of the dtype given (ten times x), or ``x`` itself.
VIEW_COPIES = {
    "select": (lambda x, y: x[1].copy_(y[2]), torch.float32),
    "slice_step": (lambda x, y: x[:, ::2].copy_(y[:, 1::2]), torch.float32),
    "transposed": (lambda x, y: x[:2, 1:3].copy_(y[1:, :2].t()), torch.float32),
    "row_into_column": (lambda x, y: x[:, 3].copy_(y[1, :3]), torch.float32),
    "expanded_source": (lambda x, y: x[1:].copy_(y[2:].expand(2, 4)), torch.float32),
    "broadcast_setitem": (
        lambda x, y: x.__setitem__((slice(1, None), slice(1, None)), y[0, 1:]),
        torch.float32,
    ),
    "int_to_float": (lambda x, y: x[2, ::3].copy_(y[1, 1:3]), torch.int64),
    "own_other_row": (lambda x, y: x.__setitem__(0, x[1]), None),
    "own_interleaved": (lambda x, y: _flat(x)[0::2].copy_(_flat(x)[1::2]), None),
    "own_columns_shifted_left": (lambda x, y: x.__setitem__((slice(None), slice(None, -1)), x[:, 1:]), None),
    "own_transposed_shifted_left": (lambda x, y: x.t()[:-1].copy_(x.t()[1:]), None),
}


def _programs(monkeypatch) -> list:
    """The jitted helpers ``tensor``'s reads and writes run (or record, in fused eager) from now
    on, in order."""
    from torch_tpu.runtime import tensor

    programs, apply = [], tensor.apply
    monkeypatch.setattr(tensor, "apply", lambda fn, *args: programs.append(fn) or apply(fn, *args))
    return programs


@pytest.mark.parametrize("name", VIEW_COPIES)
def test_a_copy_between_views_is_one_program_and_matches_cpu(name, monkeypatch):
    from torch_tpu.runtime import tensor

    fn, dtype = VIEW_COPIES[name]
    cpu = _base()
    cpu_source = cpu if dtype is None else _base(dtype=dtype) * 10
    tpu = cpu.to(TPU)
    tpu_source = tpu if dtype is None else cpu_source.to(TPU)
    torch_tpu.sync()
    programs = _programs(monkeypatch)
    fn(cpu, cpu_source)
    fn(tpu, tpu_source)
    assert programs == [tensor._copy_strided]
    monkeypatch.undo()
    assert_same(tpu, cpu)
    assert_same(tpu_source, cpu_source)
    assert tpu._version == cpu._version


VIEW_COPIES_APART = {  # copies ``write_view`` leaves to ``write`` as they were (x, y of dtype)
    "conjugated_source": (lambda x, y: x[1].copy_(y.conj()[2]), torch.complex64),
    "negated_source": (lambda x, y: x[1].copy_(torch._neg_view(y)[2]), torch.float32),
    "reinterpreted_source": (lambda x, y: x[1].copy_(y.view(torch.int32)[2]), torch.float32),
    "into_whole_storage": (lambda x, y: x.copy_(y[1:2].expand(3, 4)), torch.float32),
    "into_real_part": (lambda x, y: x.real[1].copy_(y[2].real), torch.complex64),
}


@pytest.mark.parametrize("name", VIEW_COPIES_APART)
def test_a_copy_one_program_cannot_take_reads_apart_and_matches_cpu(name, monkeypatch):
    """Lazy conjugate/negative bits, a storage read in another dtype, a target that is all of
    its storage: the source is read apart (or not at all), then written, as before."""
    from torch_tpu.runtime import tensor

    fn, dtype = VIEW_COPIES_APART[name]
    cpu, cpu_source = _base().to(dtype), _base().to(dtype) * 10 + (1j if dtype.is_complex else 0)
    tpu, tpu_source = cpu.to(TPU), cpu_source.to(TPU)
    torch_tpu.sync()
    programs = _programs(monkeypatch)
    fn(cpu, cpu_source)
    fn(tpu, tpu_source)
    assert tensor._copy_strided not in programs
    monkeypatch.undo()
    assert_same(tpu, cpu)


@pytest.mark.parametrize("name", ["copy_shifted_right", "setitem_rows_shifted"])
def test_a_copy_between_overlapping_views_cpu_refuses_runs_nothing(name, monkeypatch):
    """The overlap check comes first: CPU's error, no program, nothing written."""
    tpu = _base().to(TPU)
    torch_tpu.sync()
    programs = _programs(monkeypatch)
    with pytest.raises(RuntimeError, match="single memory location"):
        OVERLAP_ERRORS[name](tpu)
    assert programs == []
    monkeypatch.undo()
    assert_same(tpu, _base())


def test_a_row_copied_at_each_step_of_a_loop_is_one_program_of_one_executable(monkeypatch):
    """``x[j] = y[i]`` over a loop (PyTorch's index_copy determinism test runs 120,000 steps):
    one program a step, the same executable for every ``i`` and ``j`` (offsets are its inputs),
    and CPU's result."""
    from torch_tpu.runtime import tensor

    rows = torch.randint(20, (40,), generator=torch.Generator().manual_seed(0)).tolist()
    cpu, cpu_source = torch.zeros(20, 4, 3), torch.rand(40, 4, 3)
    tpu, tpu_source = cpu.to(TPU), cpu_source.to(TPU)
    # the first two steps compile: for x's value as copied, then as written (flat); y[0], at
    # y's start, would be one more
    for i in (1, 2):
        for x, y in ((cpu, cpu_source), (tpu, tpu_source)):
            x[rows[i]] = y[i]
    torch_tpu.sync()
    stats = torch.tpu.compilation_cache_stats()
    compiles = stats["xla_compiles"] + stats["disk_hits"]
    programs = _programs(monkeypatch)
    for i, j in enumerate(rows[3:], 3):
        cpu[j] = cpu_source[i]
        tpu[j] = tpu_source[i]
    assert programs == [tensor._copy_strided] * (len(rows) - 3)
    monkeypatch.undo()
    if torch_tpu.get_eager_mode() == torch_tpu.EagerMode.STRICT:  # (fused compiles its graph)
        stats = torch.tpu.compilation_cache_stats()
        assert stats["xla_compiles"] + stats["disk_hits"] == compiles
    assert_same(tpu, cpu)


def test_version_counter_is_shared_by_views():
    cpu, tpu = _base(), _base().to(TPU)
    for x in (cpu, tpu):
        view = x.t()[1]
        before = x._version
        view.add_(1)
        assert x._version == view._version == before + 1


def test_views_share_storage_and_copies_do_not():
    tpu = _base().to(TPU)
    assert tpu.t()._base is tpu and tpu[1:]._base is tpu
    assert _shares_storage(tpu.view(12), tpu)
    assert not _shares_storage(tpu.clone(), tpu)
    assert not _shares_storage(tpu + 0, tpu)
    assert tpu.untyped_storage().device.type == "tpu"


def test_clone_is_independent():
    tpu = _base().to(TPU)
    copy = tpu.t().clone()
    copy.add_(100)
    assert_same(tpu, _base())
    assert_same(copy, _base().t() + 100)


# ----------------------------------------------------------------------------- autograd
GRAD_FNS = {
    "transpose_slice": lambda a: (a.t()[1:] * torch.arange(9.0).reshape(3, 3).to(a.device)).sum(),
    "expand": lambda a: (a[:1].expand(3, 4) * a).sum(),
    "diagonal": lambda a: (a.diagonal() ** 2).sum(),
    "unfold": lambda a: a.unfold(1, 2, 1).prod(-1).sum(),
    "as_strided": lambda a: a.as_strided((2, 3), (2, 1), 1).exp().sum(),
    "view_step_slice": lambda a: (a.view(2, 6)[:, ::2] * 3).sum(),
    "select_narrow": lambda a: a.select(0, 1).sum() + a.narrow(1, 2, 2).pow(2).sum(),
    "permute_reshape": lambda a: a.view(2, 3, 2).permute(2, 0, 1).reshape(-1, 3).sin().sum(),
}


@pytest.mark.parametrize("name", GRAD_FNS)
def test_autograd_through_views(name):
    cpu_leaf = (_base() / 10).requires_grad_()
    tpu_leaf = (_base() / 10).to(TPU).requires_grad_()
    GRAD_FNS[name](cpu_leaf).backward()
    GRAD_FNS[name](tpu_leaf).backward()
    assert tpu_leaf.grad.shape == cpu_leaf.grad.shape
    torch.testing.assert_close(tpu_leaf.grad.cpu(), cpu_leaf.grad)


def _inplace_on_views(a: torch.Tensor) -> torch.Tensor:
    """In-place writes into views of a non-leaf: autograd records them as CopySlices."""
    b = a * 1
    b[0].mul_(2)
    b.t()[1].add_(a[2, 0] * 3)
    b.diagonal().mul_(a[0, 3])
    return (b * b).sum()


def test_autograd_through_inplace_writes_on_views():
    cpu_leaf = (_base() / 10).requires_grad_()
    tpu_leaf = (_base() / 10).to(TPU).requires_grad_()
    cpu_loss, tpu_loss = _inplace_on_views(cpu_leaf), _inplace_on_views(tpu_leaf)
    cpu_loss.backward()
    tpu_loss.backward()
    torch.testing.assert_close(tpu_loss.cpu(), cpu_loss)
    torch.testing.assert_close(tpu_leaf.grad.cpu(), cpu_leaf.grad)


def test_copy_slices_grad_fn():
    a = _base().to(TPU).requires_grad_()
    b = a.clone()
    b[1].mul_(2)
    assert type(b.grad_fn).__name__ == "CopySlices"


# ----------------------------------------------------------------------------- empty is lazy
def test_empty_does_not_allocate_until_used():
    gc.collect()
    before = torch.tpu.memory_allocated()
    huge = torch.empty(1 << 28, device=TPU)  # 1 GiB of float32
    assert torch.tpu.memory_allocated() - before < 1 << 20
    assert huge.shape == (1 << 28,) and huge.untyped_storage().nbytes() == 4 << 28
    del huge

    small = torch.empty(1 << 20, device=TPU)
    assert isinstance(_buffer.get(small.untyped_storage()), _buffer.Uninitialized)
    small[:3] = torch.tensor([1.0, 2.0, 3.0])  # the first write materializes the whole buffer
    torch_tpu.sync()  # (in fused eager the write is still pending)
    value = _buffer.get(small.untyped_storage())
    assert isinstance(value, jax.Array) and value.nbytes == 4 << 20
    assert small[:4].tolist()[:3] == [1.0, 2.0, 3.0]


def test_empty_strided_and_views_of_empty():
    x = torch.empty_strided((3, 4), (1, 3), device=TPU)
    assert x.stride() == (1, 3)
    x.copy_(_base())
    assert_same(x, _base())
    assert_same(x.t(), _base().t())


# ----------------------------------------------------------------------------- conversions
CASTS = [
    (torch.float32, torch.int32),
    (torch.float32, torch.bfloat16),
    (torch.float32, torch.float16),
    (torch.int64, torch.float32),
    (torch.int32, torch.bool),
    (torch.float32, torch.float64),
    (torch.bool, torch.float32),
    (torch.int64, torch.int8),
    (torch.float32, torch.complex64),
    (torch.uint8, torch.int64),
]


@pytest.mark.parametrize("source,target", CASTS, ids=lambda d: str(d).removeprefix("torch."))
def test_to_dtype_matches_cpu(source, target):
    cpu = torch.linspace(-3.7, 3.9, 12).reshape(3, 4) * (1 if source.is_floating_point else 20)
    cpu = cpu.abs().to(source) if source == torch.uint8 else cpu.to(source)
    tpu = cpu.to(TPU)
    assert_same(tpu.to(target), cpu.to(target))
    assert_same(tpu.t().to(target), cpu.t().to(target))
    assert tpu.to(source) is tpu


def test_to_cpu_and_back_of_views():
    cpu = _base((2, 3, 4))
    tpu = cpu.to(TPU)
    for view in (lambda x: x.permute(2, 0, 1), lambda x: x[:, ::2, 1:], lambda x: x.unfold(2, 2, 1)):
        assert torch.equal(view(tpu).to("cpu"), view(cpu))
        assert torch.equal(view(tpu).cpu(), view(cpu))
    assert_same(cpu.permute(2, 0, 1).to(TPU), cpu.permute(2, 0, 1))


def test_non_blocking_transfers():
    cpu = _base()
    tpu = cpu.to(TPU, non_blocking=True)
    back = tpu.mul(2).to("cpu", non_blocking=True)
    torch.tpu.synchronize()
    assert torch.equal(back, cpu * 2)
    target = torch.zeros(3, 4, device=TPU)
    target.copy_(cpu, non_blocking=True)
    assert_same(target, cpu)


def test_host_tensor_mutation_after_transfer_does_not_leak():
    cpu = _base()
    tpu = cpu.to(TPU)
    cpu.add_(1000)
    assert_same(tpu, _base())


@pytest.mark.parametrize(
    "dtype",
    [torch.float32, torch.int64, torch.bool, torch.bfloat16, torch.complex64, torch.complex128, torch.uint32],
)
def test_repr_matches_cpu(dtype):
    cpu = (_base() - 5).to(dtype)
    tpu = cpu.to(TPU)
    assert "device='tpu:0'" in repr(tpu)
    assert _without_device(repr(tpu)) == repr(cpu)
    assert _without_device(str(tpu.t())) == str(cpu.t())


def _without_device(text: str) -> str:
    """A tpu tensor's repr as the CPU one would read (the suffix may wrap onto its own line)."""
    text = re.sub(r",\s*device='tpu:0',\s*", ", ", text)  # the suffix may push dtype= onto a new line
    return re.sub(r",\s*device='tpu:0'", "", text)


def test_repr_of_large_tensor_is_summarized_like_cpu():
    cpu = torch.linspace(-1, 1, 5000).reshape(50, 100)
    assert _without_device(repr(cpu.to(TPU))) == repr(cpu)


def test_printing_tensors_of_new_shapes_compiles_nothing():
    """The formatter's own ops (masked_select, abs, max, ceil...) run on a host copy, as
    PyTorch runs them for XLA tensors: on the device they compiled ~20 programs a new shape."""
    cpus = [torch.linspace(-3, 3, 5 * n).reshape(n, 5) for n in range(23, 27)]
    cpus += [torch.arange(1100 + n).float().reshape(-1, 1) for n in range(3)]  # (summarized)
    tensors = [cpu.to(TPU) * 2 for cpu in cpus]
    torch.tpu.synchronize()
    stats = torch.tpu.compilation_cache_stats()
    before = stats["xla_compiles"] + stats["disk_hits"]
    texts = [repr(t) for t in tensors] + [str(tensors[0].t())]
    stats = torch.tpu.compilation_cache_stats()
    assert stats["xla_compiles"] + stats["disk_hits"] == before
    expected = [repr(cpu * 2) for cpu in cpus] + [str((cpus[0] * 2).t())]
    assert [_without_device(text) for text in texts] == expected


@pytest.mark.parametrize(
    "dtype",
    [
        torch.float32,
        torch.int64,
        torch.bool,
        torch.bfloat16,
        torch.complex64,
        torch.complex128,
        torch.int8,
        torch.uint64,
    ],
)
def test_item_and_tolist(dtype):
    cpu = (_base() - 4).to(dtype)
    tpu = cpu.to(TPU)
    assert tpu[1, 2].item() == cpu[1, 2].item()
    assert type(tpu[1, 2].item()) is type(cpu[1, 2].item())
    assert tpu.tolist() == cpu.tolist()
    assert tpu.t()[1:].tolist() == cpu.t()[1:].tolist()


def test_numpy_fails_like_cuda():
    with pytest.raises(
        TypeError,
        match=r"can't convert tpu:0 device type tensor to numpy\. "
        r"Use Tensor\.cpu\(\) to copy the tensor to host memory",
    ):
        torch.ones(2, device=TPU).numpy()


# ----------------------------------------------------------------------------- dtypes
def _extremes(dtype: torch.dtype) -> torch.Tensor:
    if dtype == torch.bool:
        return torch.tensor([True, False, True])
    if dtype.is_complex:
        parts = _extremes(dtype.to_real())
        return torch.complex(parts, parts.flip(0))
    if dtype.is_floating_point:
        info = torch.finfo(dtype)
        return torch.tensor(
            [
                0.0,
                -0.0,
                1.5,
                info.max,
                info.min,
                info.tiny,
                info.smallest_normal / 4,
                info.eps,
                float("inf"),
                -float("inf"),
                float("nan"),
            ],
            dtype=dtype,
        )
    info = torch.iinfo(dtype)
    return torch.tensor([0, 1, -1 if info.min else 2, info.min, info.max], dtype=dtype)


SUPPORTED = [
    torch.bool,
    torch.uint8,
    torch.uint16,
    torch.uint32,
    torch.uint64,
    torch.int8,
    torch.int16,
    torch.int32,
    torch.int64,
    torch.float16,
    torch.bfloat16,
    torch.float32,
    torch.float64,
    torch.complex64,
    torch.complex128,
]


@pytest.mark.parametrize("dtype", SUPPORTED, ids=str)
def test_dtype_round_trips_exactly(dtype):
    cpu = _extremes(dtype)
    tpu = cpu.to(TPU)
    assert tpu.dtype == dtype
    assert_same(tpu, cpu)
    assert_same(tpu.clone(), cpu)
    assert_same(torch.empty(cpu.shape, dtype=dtype, device=TPU).copy_(cpu), cpu)


@pytest.mark.parametrize("dtype", [torch.complex32, torch.float4_e2m1fn_x2, torch.bits8], ids=str)
def test_unsupported_dtype_is_a_clear_error(dtype):
    with pytest.raises(TypeError, match=f"tpu does not support dtype {dtype}"):
        torch.empty(3, dtype=dtype, device=TPU)
    with pytest.raises(TypeError, match=f"tpu does not support dtype {dtype}"):
        torch.zeros(3 * dtype.itemsize, dtype=torch.uint8).view(dtype).to(TPU)  # (CPU casts to none)
    with pytest.raises(TypeError, match=f"tpu does not support dtype {dtype}"):
        torch.ones(3, device=TPU).to(dtype)


def test_views_run_the_cpp_cores_kernels_where_it_is_loaded():
    """A view only computes geometry: with the C++ runtime core its PrivateUse1 kernel is CPU's
    (no Python on the way); the Python kernels serve only without the core
    (``tests/runtime/test_native_fallback.py``)."""
    from torch_tpu.ops import dispatch as _dispatch
    from torch_tpu.ops.registry import LOWERINGS
    from torch_tpu.runtime import native

    if not native.available():
        pytest.skip("the C++ runtime core is not built")
    views = [op for op, entry in LOWERINGS.items() if entry.native]
    assert torch.ops.aten.as_strided.default in views and torch.ops.aten.view.default in views
    assert set(views) == _dispatch.SERVED_BY_THE_CORE
    for op in views:
        table = torch._C._dispatch_dump_table(op.name()).splitlines()
        (kernel,) = [line for line in table if line.startswith("PrivateUse1")]
        assert "csrc/runtime/TpuKernels.cpp" in kernel, (op, kernel)
