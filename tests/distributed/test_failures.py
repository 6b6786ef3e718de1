"""Collectives that cannot complete raise instead of hanging. In the debug mode
(``TORCH_DISTRIBUTED_DEBUG=DETAIL``) mismatched calls raise on every rank and the group stays
usable; by default a rank that never joins, or dies, makes the others raise within the group's
timeout, naming the collective and the missing rank, and the processes exit."""

from __future__ import annotations

import re

from torch_tpu.distributed.runtime import free_port_pair

from .launch import checks_passed, torchrun


def test_mismatched_calls_raise_in_the_debug_mode():
    assert checks_passed(torchrun("failures.py", "mismatch")) == [8, 7]


def test_a_rank_that_never_joins_makes_the_others_raise_within_the_timeout():
    assert checks_passed(torchrun("failures.py", "absent")) == [5, 1]


def test_a_rank_that_dies_makes_the_others_raise_and_exit():
    done = torchrun("failures.py", "dead", timeout=60)
    output = f"exit {done.returncode}\n{done.stdout}\n{done.stderr[-5000:]}"
    # rank 0 raised naming rank 1, then ended without JAX's shutdown (it waits for rank 1)
    assert re.search(r"rank 0 ok 1(?!\d)", done.stdout), output
    assert "broadcast" in done.stderr and "rank 1 stopped responding" in done.stderr, output
    assert "exiting without JAX's shutdown" in done.stderr, output
    assert done.returncode == 1, output


def _losses(directory, rank: int) -> dict[int, tuple[int, str]]:
    """step -> (attempt, loss) as the rank logged them."""
    rows = [line.split() for line in (directory / f"losses-{rank}.txt").read_text().splitlines()]
    return {int(step): (int(attempt), loss) for attempt, step, loss in rows}


def test_a_job_restarts_after_a_killed_rank_and_resumes_from_its_checkpoint(tmp_path):
    """rank 1 is SIGKILLed in the middle of step 3: torchrun (``--max-restarts 1``) restarts the
    job, which resumes from the step-2 checkpoint; every step's loss equals the uninterrupted
    run's, bit for bit."""
    rendezvous = ["--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{free_port_pair()}"]
    killed, whole = tmp_path / "killed", tmp_path / "whole"
    killed.mkdir(), whole.mkdir()
    checks_passed(torchrun("restart.py", str(killed), "kill", launcher=["--max-restarts=1", *rendezvous]))
    checks_passed(torchrun("restart.py", str(whole), "go"))
    for rank in (0, 1):
        got, want = _losses(killed, rank), _losses(whole, rank)
        assert [got[s][0] for s in range(6)] == [0, 0, 0, 1, 1, 1], got  # (steps 3-5 after the restart)
        assert {s: loss for s, (_, loss) in got.items()} == {s: loss for s, (_, loss) in want.items()}
