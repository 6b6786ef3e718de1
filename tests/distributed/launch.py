"""Launch a worker script under ``torchrun --nproc-per-node 2`` (the CPU stand-in: each rank is a
JAX process with one CPU device; JAX's gloo collectives carry the traffic). Every launch costs
seconds, so a worker checks many things and prints ``rank <r> ok <checks>`` at its end."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from torch_tpu.distributed.runtime import free_port_pair

WORKERS = Path(__file__).resolve().parent / "workers"


def torchrun(worker: str, *args: str, nproc: int = 2, timeout: int = 240, launcher=(), **env: str):
    """Run ``workers/<worker>`` (a ``.py`` file; else a module, as ``-m worker``) on ``nproc``
    ranks (killed after ``timeout`` s: a hang fails); ``launcher``: more torchrun options (a
    rendezvous of their own replaces ``--master-addr`` and ``--master-port``)."""
    target = [str(WORKERS / worker)] if worker.endswith(".py") else ["-m", worker]
    command = [
        "timeout", "-k", "10", str(timeout),
        sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={nproc}",
        *(launcher if any(o.startswith("--rdzv") for o in launcher) else [
            *launcher, "--master-addr=127.0.0.1", f"--master-port={free_port_pair()}"
        ]),
        "--monitor-interval=0.2", *target, *args,
    ]  # fmt: skip
    return subprocess.run(
        command,
        env={**os.environ, "OMP_NUM_THREADS": "1", **env},
        capture_output=True,
        text=True,
        cwd=WORKERS,
    )


def checks_passed(done, nproc: int = 2) -> list[int]:
    """Each rank's count of passed checks (the run must have succeeded on every rank)."""
    output = f"exit {done.returncode}\n--- stdout\n{done.stdout}\n--- stderr\n{done.stderr[-20000:]}"
    assert done.returncode == 0, output
    # (not anchored to lines: the ranks share one stdout, and their lines can run together)
    counts = {int(r): int(n) for r, n in re.findall(r"rank (\d+) ok (\d+)(?!\d)", done.stdout)}
    assert sorted(counts) == list(range(nproc)), output
    return [counts[r] for r in range(nproc)]
