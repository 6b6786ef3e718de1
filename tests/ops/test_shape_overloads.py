"""Shape and resampling overloads the OpInfo samples do not reach (explicit scales, uint8 and
antialiased bicubic images, backward ops called directly, the ``_unsafe_*`` indexing family),
each compared with PyTorch CPU on the same call."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import torch_tpu  # noqa: F401

from .cases import assert_build_matches_cpu, assert_gradient_matches_cpu, seeded

aten = torch.ops.aten


_x = seeded


def _image(*shape, seed=0):
    """uint8 pixels spread over the whole range (rounding and saturation both matter)."""
    return (_x(*shape, seed=seed) * 60 + 128).clamp(0, 255).to(torch.uint8)


def _index(*values):
    return torch.tensor(values)


CASES = {
    "upsample_nearest2d scales": lambda d: aten.upsample_nearest2d.default(
        _x(1, 2, 4, 5).to(d), [7, 9], 1.7, 2.3
    ),
    "_upsample_nearest_exact1d scales": lambda d: aten._upsample_nearest_exact1d.default(
        _x(2, 3, 5).to(d), [8], 1.5
    ),
    "upsample_bilinear2d scales": lambda d: aten.upsample_bilinear2d.default(
        _x(1, 2, 4, 5).to(d), [6, 9], False, 1.4, 1.9
    ),
    "upsample_bicubic2d uint8 align_corners": lambda d: F.interpolate(
        _image(1, 3, 6, 7).to(d), size=(9, 4), mode="bicubic", align_corners=True
    ),
    "upsample_bilinear2d uint8": lambda d: F.interpolate(
        _image(1, 3, 6, 7).to(d), size=(9, 4), mode="bilinear"
    ),
    "_upsample_bicubic2d_aa": lambda d: F.interpolate(
        _x(1, 2, 9, 8).to(d), size=(4, 11), mode="bicubic", antialias=True
    ),
    "_upsample_bicubic2d_aa float64 align_corners": lambda d: F.interpolate(
        _x(1, 2, 9, 8, dtype=torch.float64).to(d),
        size=(5, 3),
        mode="bicubic",
        antialias=True,
        align_corners=True,
    ),
    "_upsample_bicubic2d_aa uint8": lambda d: F.interpolate(
        _image(1, 3, 12, 10).to(d), size=(5, 4), mode="bicubic", antialias=True
    ),
    "_upsample_bilinear2d_aa uint8": lambda d: F.interpolate(
        _image(1, 3, 12, 10).to(d), size=(5, 14), mode="bilinear", antialias=True
    ),
    "affine_grid_generator 2d": lambda d: F.affine_grid(_x(2, 2, 3).to(d), [2, 3, 4, 5], align_corners=False),
    "affine_grid_generator 3d": lambda d: F.affine_grid(
        _x(2, 3, 4).to(d), [2, 3, 2, 4, 5], align_corners=True
    ),
    "slice_backward": lambda d: aten.slice_backward.default(_x(2, 3).to(d), [2, 7], 1, 1, 6, 2),
    "select_backward": lambda d: aten.select_backward.default(_x(2, 3).to(d), [2, 4, 3], 1, -1),
    "diagonal_backward": lambda d: aten.diagonal_backward.default(_x(2, 3).to(d), [2, 3, 4], -1, 2, 1),
    "diagonal_scatter": lambda d: torch.diagonal_scatter(_x(3, 4, 2).to(d), _x(2, 3).to(d), 1, 0, 1),
    "diag_embed": lambda d: torch.diag_embed(_x(2, 3).to(d), offset=-2, dim1=0, dim2=2),
    "as_strided_scatter": lambda d: torch.as_strided_scatter(
        _x(4, 5).to(d), _x(2, 3).to(d), (2, 3), (6, 2), 1
    ),
    "masked_scatter_backward": lambda d: aten.masked_scatter_backward.default(
        _x(3, 4).to(d), (_x(4) > 0).to(d), [5, 3]
    ),
    "stack negative dim mixed dtypes": lambda d: torch.stack(
        [_x(2, 3).to(d), _x(2, 3).to(torch.int32).to(d)], dim=-1
    ),
    "_chunk_cat": lambda d: aten._chunk_cat.default([_x(2, 5).to(d), _x(2, 3).to(d)], 1, 2),
    "pixel_shuffle batch dims": lambda d: F.pixel_shuffle(_x(2, 1, 8, 2, 3).to(d), 2),
    "pixel_unshuffle unbatched": lambda d: F.pixel_unshuffle(_x(2, 4, 6).to(d), 2),
    "channel_shuffle": lambda d: F.channel_shuffle(_x(2, 6, 3).to(d), 3),
    "im2col unbatched": lambda d: aten.im2col.default(_x(2, 5, 6).to(d), [2, 3], [1, 2], [1, 0], [2, 1]),
    "col2im": lambda d: aten.col2im.default(_x(2, 12, 3).to(d), [4, 5], [2, 3], [1, 2], [1, 0], [2, 1]),
    "col2im float16 overlaps": lambda d: aten.col2im.default(
        _x(1, 9, 16, dtype=torch.float16).to(d), [6, 6], [3, 3], [1, 1], [0, 0], [1, 1]
    ),
    "_unsafe_index": lambda d: aten._unsafe_index.Tensor(_x(3, 4).to(d), [None, _index(3, 0, 2).to(d)]),
    "_unsafe_index_put": lambda d: aten._unsafe_index_put.default(
        _x(3, 4).to(d), [_index(0, 2, 0).to(d)], _x(3, 4, seed=1).to(d), True
    ),
    "_unsafe_masked_index": lambda d: aten._unsafe_masked_index.default(
        _x(3, 4).to(d), _index(True, False, True).to(d), [None, _index(1, 9, 3).to(d)], -1.5
    ),
    "_unsafe_masked_index_put_accumulate": lambda d: aten._unsafe_masked_index_put_accumulate.default(
        _x(5).to(d), _index(True, False, True).to(d), [_index(4, 7, 4).to(d)], _x(3, seed=1).to(d)
    ),
}

#: (function, input shape): gradients of resampling ops whose backward OpInfo does not reach.
GRADIENT_CASES = {
    "_upsample_bicubic2d_aa_backward": (
        lambda x: F.interpolate(x, size=(3, 7), mode="bicubic", antialias=True),
        (1, 2, 6, 5),
    ),
    "upsample_nearest3d_backward scales": (
        lambda x: aten.upsample_nearest3d.default(x, [3, 5, 4], 1.6, 2.4, 1.5),
        (1, 2, 2, 2, 3),
    ),
    "upsample_bicubic2d_backward align_corners": (
        lambda x: F.interpolate(x, size=(7, 3), mode="bicubic", align_corners=True),
        (1, 2, 4, 5),
    ),
    "grid_sampler_2d_backward bicubic reflection": (
        lambda x: F.grid_sample(
            x,
            torch.linspace(-1.4, 1.3, 24, device=x.device).reshape(1, 3, 4, 2),
            mode="bicubic",
            padding_mode="reflection",
        ),
        (1, 2, 4, 5),
    ),
    "affine_grid_generator_backward": (
        lambda theta: F.affine_grid(theta, [1, 2, 3, 4], align_corners=False),
        (1, 2, 3),
    ),
}


@pytest.mark.parametrize("name", list(CASES))
def test_overload_matches_cpu(name):
    assert_build_matches_cpu(CASES[name])


@pytest.mark.parametrize("name", list(GRADIENT_CASES))
def test_backward_overload_matches_cpu(name):
    fn, shape = GRADIENT_CASES[name]
    x = _x(*shape)
    assert_gradient_matches_cpu(fn, x)


def test_stack_rejects_unequal_shapes_like_cpu():
    for device in ("cpu", "tpu"):
        with pytest.raises(RuntimeError, match="stack expects each tensor to be equal size"):
            torch.stack([torch.zeros(2, device=device), torch.zeros(3, device=device)])
