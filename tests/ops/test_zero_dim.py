"""0-d tensors through ops that take a ``dim``/``dims``: PyTorch treats a scalar as having one
dimension of size 1 there (dim 0 or -1), and raises IndexError beyond it, or refuses the op."""

from __future__ import annotations

import pytest
import torch

import torch_tpu  # noqa: F401

from .cpu_parity import assert_matches_cpu


def _scalar(device):
    return torch.tensor(2.5, device=device)


def _index(device):
    return torch.tensor(0, device=device)


CASES = {
    "flip": lambda d: torch.flip(_scalar(d), (0,)),
    "flip_negative": lambda d: torch.flip(_scalar(d), (-1,)),
    "flip_out_of_range": lambda d: torch.flip(_scalar(d), (1,)),
    "roll": lambda d: torch.roll(_scalar(d), 1, 0),
    "roll_flattened": lambda d: torch.roll(_scalar(d), 1),
    "rot90": lambda d: torch.rot90(_scalar(d)),
    "cumsum": lambda d: torch.cumsum(_scalar(d), 0),
    "cumprod_negative": lambda d: torch.cumprod(_scalar(d), -1),
    "cumsum_out_of_range": lambda d: torch.cumsum(_scalar(d), 1),
    "cummax": lambda d: torch.cummax(_scalar(d), 0),
    "logcumsumexp": lambda d: torch.logcumsumexp(_scalar(d), 0),
    "sort": lambda d: torch.sort(_scalar(d), 0),
    "sort_out_of_range": lambda d: torch.sort(_scalar(d), 1),
    "argsort": lambda d: torch.argsort(_scalar(d), -1),
    "topk": lambda d: torch.topk(_scalar(d), 1),
    "kthvalue": lambda d: torch.kthvalue(_scalar(d), 1, 0),
    "median": lambda d: torch.median(_scalar(d), 0),
    "mode": lambda d: torch.mode(_scalar(d), 0),
    "softmax": lambda d: torch.softmax(_scalar(d), 0),
    "log_softmax": lambda d: torch.log_softmax(_scalar(d), -1),
    "norm": lambda d: torch.norm(_scalar(d), dim=0),
    "vector_norm": lambda d: torch.linalg.vector_norm(_scalar(d), dim=0),
    "max_dim": lambda d: torch.max(_scalar(d), 0),
    "argmax": lambda d: torch.argmax(_scalar(d), 0),
    "std": lambda d: torch.std(_scalar(d), 0),
    "logsumexp": lambda d: torch.logsumexp(_scalar(d), 0),
    "gather": lambda d: torch.gather(_scalar(d), 0, _index(d)),
    "scatter": lambda d: torch.scatter(_scalar(d), 0, _index(d), 1.0),
    "index_select": lambda d: torch.index_select(_scalar(d), 0, _index(d)),
    "index_fill": lambda d: _scalar(d).index_fill(0, _index(d), 1.0),
    "take_along_dim": lambda d: torch.take_along_dim(_scalar(d), _index(d), 0),
    "narrow": lambda d: torch.narrow(_scalar(d), 0, 0, 1),
    "unbind": lambda d: torch.unbind(_scalar(d), 0),
    "select": lambda d: torch.select(_scalar(d), 0, 0),
    "diff": lambda d: torch.diff(_scalar(d)),
    "glu": lambda d: torch.nn.functional.glu(_scalar(d), 0),
    "renorm": lambda d: torch.renorm(_scalar(d), 2, 0, 1.0),
    "repeat_interleave": lambda d: torch.repeat_interleave(_scalar(d), 2, 0),
}


@pytest.mark.parametrize("name", CASES)
def test_matches_cpu(name):
    assert_matches_cpu(CASES[name])
