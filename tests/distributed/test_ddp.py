"""DistributedDataParallel on tpu under ``torchrun --nproc-per-node 2``, found through the
default backend for the tpu accelerator: losses and parameters equal one process training on
the whole batch (plain, ``gradient_as_bucket_view``, and ``torch.compile(backend="tpu")``)."""

from __future__ import annotations

from .launch import checks_passed, torchrun


def test_ddp_matches_one_process_on_the_whole_batch():
    assert checks_passed(torchrun("ddp.py")) == [40, 40]
