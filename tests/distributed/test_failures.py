"""Collectives that cannot complete raise instead of hanging: mismatched calls raise on every
rank (the group stays usable); a rank that never joins, or dies, makes the others raise within
the group's timeout, naming the collective and the missing rank."""

from __future__ import annotations

from .launch import checks_passed, torchrun


def test_mismatches_missing_and_dead_ranks_raise():
    assert checks_passed(torchrun("failures.py")) == [8, 5]
