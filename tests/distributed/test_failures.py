"""Collectives that cannot complete raise instead of hanging. In the debug mode
(``TORCH_DISTRIBUTED_DEBUG=DETAIL``) mismatched calls raise on every rank and the group stays
usable; by default a rank that never joins, or dies, makes the others raise within the group's
timeout, naming the collective and the missing rank, and the processes exit."""

from __future__ import annotations

import re

from .launch import checks_passed, torchrun


def test_mismatched_calls_raise_in_the_debug_mode():
    assert checks_passed(torchrun("failures.py", "mismatch")) == [8, 7]


def test_a_rank_that_never_joins_makes_the_others_raise_within_the_timeout():
    assert checks_passed(torchrun("failures.py", "absent")) == [4, 1]


def test_a_rank_that_dies_makes_the_others_raise_and_exit():
    done = torchrun("failures.py", "dead", timeout=60)
    output = f"exit {done.returncode}\n{done.stdout}\n{done.stderr[-5000:]}"
    # rank 0 raised naming rank 1, then ended without JAX's shutdown (it waits for rank 1)
    assert re.search(r"rank 0 ok 1(?!\d)", done.stdout), output
    assert "broadcast" in done.stderr and "rank 1 stopped responding" in done.stderr, output
    assert "exiting without JAX's shutdown" in done.stderr, output
    assert done.returncode == 1, output
