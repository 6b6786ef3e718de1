"""Sharded embeddings over tpu_dist: TorchRec's planner and ``DistributedModelParallel`` shard a
DLRM's tables over 2 processes (table-wise, row-wise, column-wise, data-parallel), with the fused
optimizer in the backward and the all-to-all/reduce-scatter exchanges as tpu_dist collectives; every rank's
losses equal the same run on CPU over gloo (``workers/sharded_dlrm.py``); and
``DistributedModelParallel(model, device="tpu")`` with TorchRec's own plan."""

from __future__ import annotations

from pathlib import Path

import pytest

from ..distributed.launch import checks_passed, torchrun

pytest.importorskip("torchrec", reason="TorchRec is not installed (scripts/install_rec.sh)")
WORKER = str(Path(__file__).resolve().parent / "workers" / "sharded_dlrm.py")


@pytest.mark.parametrize(
    "sharding, optimizer",
    [
        ("table_wise", "sgd"),
        ("row_wise", "rowwise_adagrad"),
        ("column_wise", "rowwise_adagrad"),
        ("data_parallel", "sgd"),
    ],
)
def test_sharded_dlrm_trains_as_on_cpu(sharding, optimizer):
    checks = 5 if sharding == "table_wise" else 4  # (table-wise also runs TorchRec's default plan)
    assert checks_passed(torchrun(WORKER, sharding, optimizer, timeout=300)) == [checks, checks]
