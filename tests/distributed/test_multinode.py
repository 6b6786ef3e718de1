"""Two nodes on this machine: two launches of two processes each, joined by c10d rendezvous
(``torchrun``) or by the TPU VM's environment (``torch_tpu.distributed.run``, simulated), train
FSDP x TP on a 2-D mesh (``workers/mesh2d.py``)."""

from __future__ import annotations

import os
import re
import subprocess
import sys

from torch_tpu.distributed.runtime import free_port_pair

from .launch import WORKERS

SCRIPT = "mesh2d.py"


def _two_nodes(launcher: list[str], per_node_env) -> list[subprocess.CompletedProcess]:
    nodes = [
        subprocess.Popen(
            [
                "timeout",
                "-k",
                "10",
                "240",
                sys.executable,
                "-m",
                *launcher,
                "--monitor-interval=0.2",
                "mesh2d.py",
            ],
            env={**os.environ, "OMP_NUM_THREADS": "1", **per_node_env(node)},
            cwd=WORKERS,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for node in range(2)
    ]
    return [subprocess.CompletedProcess(p.args, p.wait(), *p.communicate()) for p in nodes]


def _checks(nodes) -> dict[int, int]:
    output = "\n".join(f"exit {n.returncode}\n{n.stdout}\n{n.stderr[-8000:]}" for n in nodes)
    assert all(n.returncode == 0 for n in nodes), output
    counts = {int(r): int(c) for n in nodes for r, c in re.findall(r"rank (\d+) ok (\d+)(?!\d)", n.stdout)}
    assert sorted(counts) == [0, 1, 2, 3], output
    return counts


def test_two_torchrun_nodes_with_c10d_rendezvous():
    port = free_port_pair()
    launcher = [
        "torch.distributed.run",
        "--nnodes=2",
        "--nproc-per-node=2",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint=127.0.0.1:{port}",
        "--rdzv-id=mesh2d",
    ]
    assert set(_checks(_two_nodes(launcher, lambda node: {})).values()) == {10}


def test_the_launcher_in_a_simulated_tpu_slice():
    port = free_port_pair()
    vm = {"TPU_WORKER_HOSTNAMES": "127.0.0.1,127.0.0.1", "TPU_CHIPS_PER_HOST_BOUNDS": "2,1,1"}
    launcher = ["torch_tpu.distributed.run", f"--master-port={port}"]
    nodes = _two_nodes(launcher, lambda node: {**vm, "TPU_WORKER_ID": str(node)})
    assert set(_checks(nodes).values()) == {11}  # (and each process took its chip)
