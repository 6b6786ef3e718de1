"""Ray Train (``TorchTrainer``, two TPU workers on a local Ray cluster) on tpu through
``"tpu_dist"``: losses and parameters equal one process training on the whole batch (see
``workers/ray_train.py``). Ray's own start (cluster, controller, worker actors) is most of the
minute this takes."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from .launch import WORKERS

pytest.importorskip("ray.train.torch")


@pytest.mark.slow
def test_torch_trainer_on_tpu_matches_one_process(tmp_path):
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        # fewer helper actors and quicker polling: less of Ray's fixed cost on a small box
        "RAY_TRAIN_ENABLE_PREEMPTION_WATCHER": "0",
        "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "0.2",
        "RAY_TRAIN_ENABLE_STATE_TRACKING": "0",
    }
    done = subprocess.run(
        [
            "timeout",
            "-k",
            "10",
            "300",
            sys.executable,
            str(WORKERS / "ray_train.py"),
            str(tmp_path / "rank0.pt"),
        ],
        env=env,
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    output = f"exit {done.returncode}\n--- stdout\n{done.stdout[-10000:]}\n--- stderr\n{done.stderr[-20000:]}"
    assert done.returncode == 0, output
    assert re.search(r"^ray ok 7$", done.stdout, re.M), output
