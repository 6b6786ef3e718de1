"""Output layouts are PyTorch's: an elementwise op's output follows its inputs' dense layout
(TensorIterator's rule: ``x.t() + 1`` is transposed, channels-last stays channels-last), copies
and ``*_like`` factories preserve the format, ``empty`` takes a memory format. Each case is
compared with CPU: same strides (of the dimensions longer than 1) and same values."""

from __future__ import annotations

import random

import pytest
import torch
import torch.nn.functional as F

import torch_tpu  # noqa: F401

from .cases import seeded


def _channels_last(x: torch.Tensor) -> torch.Tensor:
    return x.contiguous(memory_format=torch.channels_last)


def _significant_strides(t: torch.Tensor) -> tuple:
    return tuple(s for n, s in zip(t.shape, t.stride()) if n > 1)


# each builds its result from ``x`` (a 3x4 matrix) and ``image`` (2x3x4x5) on one device
LAYOUTS = {
    "unary_transposed": lambda x, image: torch.exp(x.t()),
    "scalar_transposed": lambda x, image: x.t() + 1,
    "binary_transposed": lambda x, image: x.t() * x.t(),
    "first_input_decides": lambda x, image: x.t().contiguous() - x.t(),
    "broadcast_transposed": lambda x, image: x.t() + x[0].reshape(4, 1),
    "strided_transposed": lambda x, image: x.t()[::2] * 3,
    "comparison_transposed": lambda x, image: x.t() > 0,
    "where_condition_decides": lambda x, image: torch.where(x.t().contiguous() > 0, x.t(), 1.0),
    "clamp_transposed": lambda x, image: torch.clamp(x.t(), -0.5, 0.5),
    "permuted_3d": lambda x, image: x.reshape(3, 2, 2).permute(2, 0, 1) * 2,
    "channels_last_unary": lambda x, image: torch.sigmoid(_channels_last(image)),
    "channels_last_binary": lambda x, image: _channels_last(image) + image,
    "channels_last_broadcast": lambda x, image: _channels_last(image) * image[0, :, :1, :1],
    "to_dtype_transposed": lambda x, image: x.t().to(torch.float64),
    "to_channels_last": lambda x, image: image.to(memory_format=torch.channels_last),
    "empty_channels_last": lambda x, image: torch.empty(
        2, 3, 4, 5, device=image.device, memory_format=torch.channels_last
    ).fill_(2),
}


@pytest.mark.parametrize("name", LAYOUTS)
def test_layout_matches_cpu(name):
    x, image = seeded(3, 4), seeded(2, 3, 4, 5, seed=1)
    expected = LAYOUTS[name](x, image)
    actual = LAYOUTS[name](x.to("tpu"), image.to("tpu"))
    assert _significant_strides(actual) == _significant_strides(expected)
    torch.testing.assert_close(actual.cpu(), expected)


@pytest.mark.parametrize("transposed", ["cpu", "tpu"])
def test_device_copies_preserve_layout(transposed):
    """``.to(device)`` keeps a dense layout both ways, as PyTorch's ``_to_copy`` does."""
    x = seeded(3, 4).to(transposed).t()
    copy = x.to("tpu" if transposed == "cpu" else "cpu")
    assert copy.stride() == x.stride()
    torch.testing.assert_close(copy.cpu(), x.cpu())


def _spd(m: torch.Tensor) -> torch.Tensor:
    return m @ m.mT + 4 * torch.eye(m.shape[-1], device=m.device)


# Ops whose results PyTorch does not lay out row-major (``ops/layout.py``): factorizations are
# column-major per matrix (LAPACK's convention), rot90 is a transposed flip, FFTs follow the
# transformed dimensions, ``*_like`` factories preserve their input's layout. Only strides are
# compared here: the values are checked against CPU by the OpInfo tests.
NON_ROW_MAJOR = {
    "svd": lambda m: torch.linalg.svd(m),
    "svd_reduced": lambda m: torch.linalg.svd(m[..., :3], full_matrices=False),
    "qr": lambda m: torch.linalg.qr(m),
    "eigh": lambda m: torch.linalg.eigh(_spd(m)),
    "cholesky": lambda m: torch.linalg.cholesky(_spd(m)),
    "inv": lambda m: torch.linalg.inv(_spd(m)),
    "solve": lambda m: torch.linalg.solve(_spd(m), m),
    "lu_factor": lambda m: torch.linalg.lu_factor(m),
    "det_lu": lambda m: torch.ops.aten._linalg_det(m),
    "solve_triangular": lambda m: torch.linalg.solve_triangular(_spd(m).tril(), m, upper=False),
    "rot90": lambda m: torch.rot90(m, 1, (1, 2)),
    "fft2": lambda m: torch.fft.fft2(m.to(torch.complex64), dim=(0, 1)),
    "rfftn": lambda m: torch.fft.rfftn(m, dim=(0, 2)),
    "zeros_like_transposed": lambda m: torch.zeros_like(m.mT),
    "full_like_channels_last": lambda m: torch.full_like(m[None], 2.0, memory_format=torch.channels_last),
    "rand_like_transposed": lambda m: torch.rand_like(m.mT),
}


@pytest.mark.parametrize("name", NON_ROW_MAJOR)
def test_non_row_major_outputs_match_cpu_strides(name):
    m = seeded(2, 4, 4, seed=2)
    expected = NON_ROW_MAJOR[name](m)
    actual = NON_ROW_MAJOR[name](m.to("tpu"))
    expected = expected if isinstance(expected, tuple) else (expected,)
    actual = actual if isinstance(actual, tuple) else (actual,)
    assert [_significant_strides(t) for t in actual] == [_significant_strides(t) for t in expected]


# Ops laid out by their meta kernel whose program returns the transposed outputs in their
# memory order (``Layout.META``): one node each in fused eager, no transpose recorded after it.
# Each: (its inputs made from ``m``, the op)
IN_MEMORY_ORDER = {
    "rot90": (lambda m: (m,), lambda m: torch.rot90(m, 1, (1, 2))),
    "qr": (lambda m: (m,), torch.linalg.qr),
    "fft2": (lambda m: (m.to(torch.complex64),), lambda c: torch.fft.fft2(c, dim=(0, 1))),
    "cat_channels_last": (lambda m: (_channels_last(m[None]),) * 2, lambda a, b: torch.cat([a, b], 1)),
}


@pytest.mark.parametrize("mode", ["strict", "fused"])
@pytest.mark.parametrize("name", IN_MEMORY_ORDER)
def test_meta_layout_outputs_come_from_their_program_in_memory_order(name, mode):
    make, op = IN_MEMORY_ORDER[name]
    inputs = make(seeded(2, 4, 4, seed=2))
    expected = op(*inputs)
    on_tpu = [x.to("tpu") for x in inputs]
    torch_tpu.sync()
    with torch_tpu.eager_mode(mode):
        before = torch_tpu.execution.pending_ops()
        actual = op(*on_tpu)
        recorded = torch_tpu.execution.pending_ops() - before
        expected, actual = (t if isinstance(t, tuple) else (t,) for t in (expected, actual))
        assert [t.stride() for t in actual] == [t.stride() for t in expected]
        torch.testing.assert_close([t.cpu() for t in actual], list(expected), rtol=1e-4, atol=1e-5)
    assert recorded == (1 if mode == "fused" else 0)


def _channels_last_3d(x: torch.Tensor) -> torch.Tensor:
    return x.contiguous(memory_format=torch.channels_last_3d)


def _kernel(x: torch.Tensor, *shape: int) -> torch.Tensor:
    """A seeded kernel on ``x``'s device and dtype."""
    return seeded(*shape, seed=3).to(x.device, x.dtype)


# nn ops on a channels-last image ``x`` (2x4x6x6) and a channels-last-3d volume ``v``
# (2x4x4x6x6): CPU keeps the format for these (its NHWC kernels), forward and backward.
# ``ops/layout.py`` follows the meta kernel where it agrees with CPU, and CPU's rule
# (the input's suggested format) where it does not.
CHANNELS_LAST_OPS = {
    "conv2d": lambda x, v: F.conv2d(x, _kernel(x, 5, 4, 3, 3), padding=1),
    "conv2d_weight_decides": lambda x, v: F.conv2d(x.contiguous(), _channels_last(_kernel(x, 5, 4, 3, 3))),
    "conv2d_strided_grouped": lambda x, v: F.conv2d(x, _kernel(x, 6, 2, 3, 3), stride=2, groups=2),
    "conv_transpose2d": lambda x, v: F.conv_transpose2d(x, _kernel(x, 4, 3, 3, 3), stride=2),
    "conv3d": lambda x, v: F.conv3d(v, _kernel(v, 3, 4, 3, 3, 3)),
    "conv3d_float64_contiguous": lambda x, v: F.conv3d(v.double(), _kernel(v, 3, 4, 3, 3, 3).double()),
    "conv_transpose3d": lambda x, v: F.conv_transpose3d(v, _kernel(v, 4, 2, 2, 2, 2)),
    "cat": lambda x, v: torch.cat([x, x * 2], 1),
    "cat_3d": lambda x, v: torch.cat([v, v], 2),
    "avg_pool2d": lambda x, v: F.avg_pool2d(x, 2),
    "max_pool2d_with_indices": lambda x, v: F.max_pool2d(x, 3, 2, 1, return_indices=True),
    "max_pool3d": lambda x, v: F.max_pool3d(v, 2),
    "adaptive_avg_pool2d": lambda x, v: F.adaptive_avg_pool2d(x, (3, 2)),
    "adaptive_max_pool2d": lambda x, v: F.adaptive_max_pool2d(x, 4, return_indices=True),
    "max_unpool2d": lambda x, v: F.max_unpool2d(*F.max_pool2d(x, 2, return_indices=True), 2),
    "batch_norm_train": lambda x, v: F.batch_norm(x, None, None, training=True),
    "batch_norm_eval": lambda x, v: F.batch_norm(
        x, torch.zeros(4, device=x.device), torch.ones(4, device=x.device)
    ),
    "group_norm": lambda x, v: F.group_norm(x, 2, _kernel(x, 4), _kernel(x, 4)),
    "group_norm_3d": lambda x, v: F.group_norm(v, 2),
    "interpolate_nearest": lambda x, v: F.interpolate(x, scale_factor=2),
    "interpolate_bilinear": lambda x, v: F.interpolate(x, size=(5, 9), mode="bilinear"),
    "interpolate_bicubic": lambda x, v: F.interpolate(x, scale_factor=1.5, mode="bicubic"),
    "interpolate_trilinear": lambda x, v: F.interpolate(v, scale_factor=2, mode="trilinear"),
    "interpolate_area": lambda x, v: F.interpolate(x, size=(3, 3), mode="area"),
    "pad_constant": lambda x, v: F.pad(x, (1, 2, 0, 1)),
    "pad_reflect": lambda x, v: F.pad(x, (1, 2, 0, 1), mode="reflect"),
    "pad_replicate_3d": lambda x, v: F.pad(v, (1, 1, 1, 1, 1, 1), mode="replicate"),
    "pixel_shuffle": lambda x, v: F.pixel_shuffle(x, 2),
    "pixel_unshuffle": lambda x, v: F.pixel_unshuffle(x, 2),
}


# PyTorch's own derivative formula makes these backward kernels' inputs contiguous on every
# device but CPU (``grads[0].contiguous(is_cpu ? suggest_memory_format : Contiguous)``), as on
# CUDA: their gradients are contiguous, and only the forward strides are compared.
CONTIGUOUS_GRADIENTS = {"group_norm", "group_norm_3d"}


def _tensors(value) -> list:
    return [t for t in torch.utils._pytree.tree_leaves(value) if isinstance(t, torch.Tensor)]


def _channels_last_run(name: str, device: str) -> tuple[list, list]:
    """The op's outputs and the gradients of its input(s) (under a channels-last cotangent)."""
    x = _channels_last(seeded(2, 4, 6, 6, seed=4)).to(device).requires_grad_()
    v = _channels_last_3d(seeded(2, 4, 4, 6, 6, seed=5)).to(device).requires_grad_()
    outputs = _tensors(CHANNELS_LAST_OPS[name](x, v))
    differentiable = [o for o in outputs if o.requires_grad]
    grads = torch.autograd.grad(
        differentiable, (x, v), [torch.ones_like(o) for o in differentiable], allow_unused=True
    )
    return outputs, [g for g in grads if g is not None]


@pytest.mark.parametrize("name", CHANNELS_LAST_OPS)
def test_channels_last_nn_ops_match_cpu_strides(name):
    expected, expected_grads = _channels_last_run(name, "cpu")
    actual, actual_grads = _channels_last_run(name, "tpu")
    assert [_significant_strides(t) for t in actual] == [_significant_strides(t) for t in expected]
    if name not in CONTIGUOUS_GRADIENTS:
        assert [_significant_strides(g) for g in actual_grads] == [
            _significant_strides(g) for g in expected_grads
        ]
    torch.testing.assert_close([t.cpu() for t in actual], expected, atol=1e-4, rtol=1e-4)


def _nhwc_net(device: str) -> tuple[torch.nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    net = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1),
        torch.nn.BatchNorm2d(8),
        torch.nn.ReLU(),
        torch.nn.MaxPool2d(2),
        torch.nn.Conv2d(8, 4, 3),
        torch.nn.AdaptiveAvgPool2d(1),
        torch.nn.Flatten(),
    )
    net = net.to(device, memory_format=torch.channels_last)
    return net, _channels_last(seeded(4, 3, 8, 8, seed=6)).to(device)


def test_channels_last_conv_net_training_step_matches_cpu():
    """One SGD step of a small NHWC conv net: activations, parameter gradients (with their
    channels-last strides) and updated weights as on CPU."""
    results = {}
    for device in ("cpu", "tpu"):
        net, x = _nhwc_net(device)
        features = net[:4](x)
        loss = net[4:](features).square().mean()
        loss.backward()
        grads = [p.grad for p in net.parameters()]
        torch.optim.SGD(net.parameters(), lr=0.1).step()
        results[device] = (features, grads, list(net.parameters()))
    (cpu_features, cpu_grads, cpu_params), (features, grads, params) = results["cpu"], results["tpu"]
    assert features.is_contiguous(memory_format=torch.channels_last)
    assert _significant_strides(features) == _significant_strides(cpu_features)
    assert [g.stride() for g in grads] == [g.stride() for g in cpu_grads]
    torch.testing.assert_close([p.detach().cpu() for p in params], [p.detach() for p in cpu_params])


def _geometries(count: int):
    """Views of many kinds: strided slices, permutations, broadcasts, empty and length-1 dims."""
    rng = random.Random(0)
    for _ in range(count):
        ndim = rng.randint(1, 4)
        shape = [rng.choice([0, 1, 2, 3, 5]) for _ in range(ndim)]
        order = rng.sample(range(ndim), ndim)
        base = torch.empty([max(n, 1) * 2 for n in shape])
        steps = tuple(slice(0, n * rng.choice([1, 2]), rng.choice([1, 2])) for n in shape)
        yield base[steps].permute(order)
        yield torch.empty(shape).permute(order)
        small = torch.empty([1 if rng.random() < 0.5 else max(n, 1) for n in shape])
        yield small.expand([max(n, 1) if m == 1 else m for n, m in zip(shape, small.shape)]).permute(order)


def test_like_strides_are_cpus_empty_like():
    """``*_like`` layouts are computed without a meta ``empty_like`` (its first call imports
    sympy): the strides must be CPU's for every geometry and memory format."""
    from torch_tpu.runtime.tensor import like_strides

    for cpu in _geometries(400):
        formats = [None, torch.preserve_format, torch.contiguous_format]
        formats += [torch.channels_last] if cpu.dim() == 4 else []
        for memory_format in formats:
            expected = torch.empty_like(cpu, memory_format=memory_format or torch.preserve_format)
            strides = like_strides(cpu, memory_format) or torch.empty(cpu.shape).stride()
            assert tuple(strides) == expected.stride(), (cpu.shape, cpu.stride(), memory_format)
