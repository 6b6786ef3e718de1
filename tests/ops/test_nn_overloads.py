"""nn, loss and pooling overloads the OpInfo samples do not reach (backward ops called with
saved tensors, Tensor-length CTC, explicit fractional-pooling samples, internal fast-path ops),
each compared with PyTorch CPU on the same call."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import torch_tpu  # noqa: F401

from .cases import seeded

aten = torch.ops.aten
_HALF = (torch.float16, torch.bfloat16)
_FLOATS = (torch.float32, torch.float64) + _HALF


_x = seeded


def _tpu(value):
    return value.to("tpu") if isinstance(value, torch.Tensor) else value


def _assert_close(actual, expected):
    """Half types: CPU rounds intermediate results to the half type, tpu computes in float32."""

    def compare(a, e):
        if e is None:  # an output the op leaves undefined
            assert a is None
            return
        tolerance = dict(atol=1e-2, rtol=1.6e-2) if e.dtype in _HALF else {}
        torch.testing.assert_close(a.cpu(), e, equal_nan=True, **tolerance)

    torch.utils._pytree.tree_map(compare, actual, expected)


def _matches_cpu(op, *args):
    _assert_close(op(*map(_tpu, args)), op(*args))


# ----------------------------------------------------------------------------- CTC
_CTC_LENGTHS = ([9, 7, 5], [3, 0, 2])  # input lengths, target lengths (one empty target)


def _ctc_inputs():
    log_probs = _x(9, 3, 5).log_softmax(2)
    targets = torch.tensor([[1, 1, 3], [2, 2, 2], [4, 2, 1]])  # a repeated label
    return log_probs, targets


@pytest.mark.parametrize("concatenated", [False, True])
def test_ctc_loss_and_backward_match_cpu(concatenated):
    log_probs, targets = _ctc_inputs()
    input_lengths, target_lengths = _CTC_LENGTHS
    if concatenated:
        targets = torch.cat([row[:n] for row, n in zip(targets, target_lengths)])
    for lengths in [
        (input_lengths, target_lengths),
        (torch.tensor(input_lengths), torch.tensor(target_lengths)),
    ]:
        results = []
        for device in ("cpu", "tpu"):
            leaf = log_probs.to(device).requires_grad_()
            device_lengths = [_tpu(n) if device == "tpu" else n for n in lengths]
            loss = F.ctc_loss(leaf, targets.to(device), *device_lengths, reduction="sum")
            results.append([loss.cpu(), torch.autograd.grad(loss, leaf)[0].cpu()])
        _assert_close(*results)


def test_ctc_log_alpha_matches_cpu_where_cpu_writes_it():
    """CPU leaves log_alpha unwritten past each sample's lengths: compared where written."""
    log_probs, targets = _ctc_inputs()
    input_lengths, target_lengths = _CTC_LENGTHS
    expected = aten._ctc_loss(log_probs, targets, input_lengths, target_lengths)
    actual = aten._ctc_loss(_tpu(log_probs), _tpu(targets), input_lengths, target_lengths)
    torch.testing.assert_close(actual[0].cpu(), expected[0])
    for sample, (frames, labels) in enumerate(zip(input_lengths, target_lengths)):
        written = (sample, slice(0, frames), slice(0, 2 * labels + 1))
        torch.testing.assert_close(actual[1][written].cpu(), expected[1][written])


@pytest.mark.parametrize("zero_infinity", [False, True])
def test_ctc_loss_backward_overloads_match_cpu(zero_infinity):
    log_probs, targets = _ctc_inputs()
    input_lengths, target_lengths = [9, 2, 5], [3, 3, 2]  # sample 1 cannot be aligned
    nll, log_alpha = aten._ctc_loss(log_probs, targets, input_lengths, target_lengths)
    grad = torch.tensor([1.0, 0.5, -2.0])
    common = (grad, log_probs, targets)
    for lengths in [
        (input_lengths, target_lengths),
        (torch.tensor(input_lengths), torch.tensor(target_lengths)),
    ]:
        op = (
            aten._ctc_loss_backward.default
            if isinstance(lengths[0], list)
            else aten._ctc_loss_backward.Tensor
        )
        expected = op(*common, *lengths, nll, log_alpha, 0, zero_infinity)
        actual = op(*map(_tpu, common + lengths + (nll, log_alpha)), 0, zero_infinity)
        # an unreachable sample's gradient is NaN on CPU unless zero_infinity clears it
        torch.testing.assert_close(actual.cpu(), expected, equal_nan=True)


# ----------------------------------------------------------------------------- losses
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])  # CPU has no half kernels
def test_margin_loss_backwards_match_cpu(dtype):
    x, grad = _x(4, 5, dtype=dtype), _x(4, seed=1, dtype=dtype)
    target = torch.tensor([0, 4, 2, 2])
    weight = _x(5, seed=2, dtype=dtype).abs()
    _matches_cpu(aten.multi_margin_loss_backward, grad, x, target, 2, 0.7, weight, 0)
    _matches_cpu(aten.multi_margin_loss_backward, grad[0], x, target, 1, 1.0, None, 1)
    labels = torch.tensor([[3, 0, -1, 1, 2], [1, 2, 4, -1, -1], [-1, 0, 0, 0, 0], [4, 4, 0, 1, 2]])
    _, is_target = aten.multilabel_margin_loss_forward(x, labels, 0)
    _matches_cpu(aten.multilabel_margin_loss_backward, grad, x, labels, 0, is_target)
    _matches_cpu(aten.soft_margin_loss_backward, grad[0], x, x.sign(), 2)


# ----------------------------------------------------------------------------- pooling
@pytest.mark.parametrize("dtype", _FLOATS)
def test_fractional_max_pool_matches_cpu(dtype):
    """The random samples are an argument, so the windows are the same on both devices."""
    samples = torch.rand(2, 3, 3, generator=torch.Generator().manual_seed(1)).to(dtype)
    cases = [
        (
            aten.fractional_max_pool2d,
            aten.fractional_max_pool2d_backward,
            _x(2, 3, 9, 8),
            (2, 3),
            (5, 4),
            samples[..., :2],
        ),
        (
            aten.fractional_max_pool2d,
            aten.fractional_max_pool2d_backward,
            _x(3, 7, 6),
            (3, 2),
            (1, 5),
            samples[:1, :, :2],
        ),
        (
            aten.fractional_max_pool3d,
            aten.fractional_max_pool3d_backward,
            _x(2, 3, 6, 7, 5),
            (2, 3, 2),
            (4, 3, 3),
            samples,
        ),
    ]
    for forward, backward, x, kernel, output_size, random_samples in cases:
        x = x.to(dtype)
        _matches_cpu(forward, x, kernel, output_size, random_samples)
        out, indices = forward(x, kernel, output_size, random_samples)
        _matches_cpu(backward, torch.ones_like(out), x, kernel, output_size, indices)


# ----------------------------------------------------------------------------- embedding bag
_BAG_INDICES = torch.tensor([0, 2, 4, 1, 4, 3, 2, 2])
_BAG_OFFSETS = torch.tensor([0, 3, 3, 5])  # bag 1 is empty


@pytest.mark.parametrize("mode", [0, 1, 2])
@pytest.mark.parametrize("dtype", _FLOATS)
def test_embedding_bag_overloads_match_cpu(mode, dtype):
    weight = _x(5, 3, dtype=dtype)
    sample_weights = (
        torch.rand(8, generator=torch.Generator().manual_seed(2)).to(dtype) if mode == 0 else None
    )
    for padding_idx in (-1, 2):
        for op in (aten._embedding_bag, aten._embedding_bag_forward_only):
            _matches_cpu(
                op, weight, _BAG_INDICES, _BAG_OFFSETS, False, mode, False, sample_weights, False, padding_idx
            )
        _matches_cpu(
            aten._embedding_bag,
            weight,
            _BAG_INDICES,
            torch.tensor([0, 3, 3, 5, 8]),
            False,
            mode,
            False,
            sample_weights,
            True,
            padding_idx,
        )
        _, offset2bag, bag_size, max_indices = aten._embedding_bag(
            weight, _BAG_INDICES, _BAG_OFFSETS, False, mode, False, sample_weights, False, padding_idx
        )
        grad = _x(4, 3, seed=3, dtype=dtype)
        # scale_grad_by_freq off: CPU's kernel is wrong for repeated indices (see below)
        _matches_cpu(
            aten._embedding_bag_backward,
            grad,
            _BAG_INDICES,
            _BAG_OFFSETS,
            offset2bag,
            bag_size,
            max_indices,
            5,
            False,
            mode,
            False,
            sample_weights,
            padding_idx,
        )
        if offset2bag.numel():
            _matches_cpu(
                aten._embedding_bag_dense_backward,
                grad,
                _BAG_INDICES,
                offset2bag,
                bag_size,
                max_indices,
                5,
                False,
                mode,
                sample_weights,
                padding_idx,
            )
        if mode == 0:
            _matches_cpu(
                aten._embedding_bag_per_sample_weights_backward,
                grad,
                weight,
                _BAG_INDICES,
                _BAG_OFFSETS,
                offset2bag,
                mode,
                padding_idx,
            )


# ----------------------------------------------------------------------------- nn internals
@pytest.mark.parametrize("dtype", _FLOATS)
def test_masked_softmax_and_backward_match_cpu(dtype):
    x = _x(2, 3, 4, 4, dtype=dtype)
    mask = torch.rand(2, 3, 4, 4, generator=torch.Generator().manual_seed(1)) > 0.6
    mask[0, 0, 0] = True  # a fully masked row: NaN on CPU
    _matches_cpu(aten._masked_softmax, x, mask, 3, 2)
    _matches_cpu(aten._masked_softmax, x, mask[0, 0], None, 0)  # (T, T) attention mask
    _matches_cpu(aten._masked_softmax, x, mask[:, 0, 0], 3, 1)  # (B, T) key padding mask
    output = aten._masked_softmax(x, mask, 3, 2)
    _matches_cpu(aten._masked_softmax_backward, _x(2, 3, 4, 4, seed=2, dtype=dtype), output, mask, 3)


@pytest.mark.parametrize("dtype", _FLOATS)
def test_weight_norm_interface_and_backward_match_cpu(dtype):
    v = _x(4, 3, 2, dtype=dtype)
    for dim, g in [(0, _x(4, 1, 1, seed=1, dtype=dtype)), (2, _x(1, 1, 2, seed=1, dtype=dtype))]:
        _matches_cpu(aten._weight_norm_interface, v, g, dim)
        _, norms = aten._weight_norm_interface(v, g, dim)
        _matches_cpu(aten._weight_norm_interface_backward, _x(4, 3, 2, seed=2, dtype=dtype), v, g, norms, dim)


@pytest.mark.parametrize("dtype", _FLOATS)
def test_batch_norm_update_stats_updates_running_stats_like_cpu(dtype):
    x = _x(4, 3, 5, dtype=dtype)
    _matches_cpu(aten.batch_norm_update_stats, x, None, None, 0.1)
    stats_dtype = torch.float64 if dtype == torch.float64 else torch.float32
    expected_stats = [_x(3, seed=1, dtype=stats_dtype), _x(3, seed=2, dtype=stats_dtype).abs()]
    actual_stats = [s.to("tpu") for s in expected_stats]
    actual = aten.batch_norm_update_stats(_tpu(x), *actual_stats, 0.1)
    expected = aten.batch_norm_update_stats(x, *expected_stats, 0.1)
    _assert_close(list(actual) + actual_stats, list(expected) + expected_stats)


def test_conv_tbc_and_gradients_match_cpu():
    x, weight, bias = _x(7, 2, 3), _x(3, 3, 5, seed=1), _x(5, seed=2)
    grads = []
    for device in ("cpu", "tpu"):
        leaves = [t.to(device).requires_grad_() for t in (x, weight, bias)]
        out = aten.conv_tbc(*leaves, 1)
        cotangent = torch.linspace(-1, 1, out.numel()).reshape(out.shape).to(device)
        grads.append([out.cpu()] + [g.cpu() for g in torch.autograd.grad(out, leaves, cotangent)])
    _assert_close(grads[1], grads[0])


# ----------------------------------------------------------------------------- transformer fast path
@pytest.mark.parametrize("need_weights, average", [(True, True), (True, False), (False, True)])
def test_native_multi_head_attention_matches_cpu(need_weights, average):
    mha = torch.nn.MultiheadAttention(16, 4, batch_first=True)
    weights = [
        p.detach() for p in (mha.in_proj_weight, mha.in_proj_bias, mha.out_proj.weight, mha.out_proj.bias)
    ]
    padding = torch.tensor([[False] * 5, [False] * 3 + [True] * 2])
    _matches_cpu(
        aten._native_multi_head_attention.default,
        _x(2, 5, 16),
        _x(2, 5, 16, seed=1),
        _x(2, 5, 16, seed=2),
        16,
        4,
        *weights,
        padding,
        need_weights,
        average,
        1,
    )


@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("activation", ["relu", "gelu"])
def test_transformer_encoder_layer_inference_fast_path_matches_cpu(norm_first, activation):
    """Eval mode without grad: PyTorch routes the layer to ``_transformer_encoder_layer_fwd``."""
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(
        16, 4, 32, batch_first=True, norm_first=norm_first, activation=activation
    ).eval()
    x, padding = _x(2, 5, 16), torch.tensor([[False] * 5, [False] * 3 + [True] * 2])
    with torch.no_grad():
        expected = [layer(x), layer(x, src_key_padding_mask=padding)]
        layer.to("tpu")
        actual = [layer(_tpu(x)), layer(_tpu(x), src_key_padding_mask=_tpu(padding))]
    _assert_close(actual, expected)


def test_embedding_bag_scale_grad_by_freq_divides_by_each_index_count():
    """As ``F.embedding`` does (and CUDA): each row's gradient is (uses / frequency) = 1 here.
    CPU's embedding_bag kernel gives 1.5 for row 3 (it divides by another index's count)."""
    weight = torch.randn(5, 2, device="tpu", requires_grad=True)
    indices, offsets = torch.tensor([3, 1, 1, 0, 3, 3]), torch.tensor([0, 3])
    F.embedding_bag(
        _tpu(indices), weight, _tpu(offsets), mode="sum", scale_grad_by_freq=True
    ).sum().backward()
    assert weight.grad[:, 0].cpu().tolist() == [1.0, 1.0, 0.0, 1.0, 0.0]
