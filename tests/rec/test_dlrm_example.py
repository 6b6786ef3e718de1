"""``examples/dlrm.py`` (TorchRec's DLRM, its tables sharded by TorchRec's planner) on 2 processes
at a small size: the loss falls (the example's own check) on every rank's plan."""

from __future__ import annotations

from pathlib import Path

import pytest

from ..distributed.launch import torchrun

pytest.importorskip("torchrec", reason="TorchRec is not installed (scripts/install_rec.sh)")
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "dlrm.py"


def test_dlrm_example_trains_sharded_over_two_processes():
    done = torchrun(str(EXAMPLE), "--steps", "30", "--rows", "200", "--dim", "8", timeout=300)
    output = f"exit {done.returncode}\n{done.stdout}\n{done.stderr[-5000:]}"
    assert done.returncode == 0, output
    for line in (
        "26 tables of 200 x 8 on 2 process(es)",
        "rank:1/tpu:0",
        "steps/s",
        "(mean of 10 steps) [ok]",
    ):
        assert line in done.stdout, output
