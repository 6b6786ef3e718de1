"""Every c10d collective on tpu tensors through ``"tpu_dist"`` equals gloo's on the same CPU
tensors, under ``torchrun --nproc-per-node 2`` (one launch; the worker holds the checks)."""

from __future__ import annotations

from .launch import checks_passed, torchrun


def test_collectives_match_gloo():
    counts = checks_passed(torchrun("collectives.py"))
    assert min(counts) >= 80  # (rank 1 also runs the one-rank subgroup's checks)
