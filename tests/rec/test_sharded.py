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
    "sharding, optimizer, kernel",
    [
        ("table_wise", "sgd", None),
        ("row_wise", "rowwise_adagrad", None),
        ("column_wise", "rowwise_adagrad", None),
        ("data_parallel", "sgd", None),
        ("table_wise", "sgd", "unfused_tpu"),  # (TorchRec's own tpu kernel, torchrec:: ops)
    ],
)
def test_sharded_dlrm_trains_as_on_cpu(sharding, optimizer, kernel):
    checks = 5 if sharding == "table_wise" else 4  # (table-wise also runs TorchRec's default plan)
    done = torchrun(WORKER, sharding, optimizer, *([kernel] if kernel else []), timeout=300)
    assert checks_passed(done) == [checks, checks]
