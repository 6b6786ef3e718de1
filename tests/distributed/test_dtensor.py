"""DTensor and tensor parallelism on tpu (eager and compiled) against one process."""

from __future__ import annotations

from .launch import checks_passed, torchrun


def test_dtensor_and_tensor_parallelism_match_one_process():
    assert checks_passed(torchrun("dtensor.py")) == [42, 42]
