"""``python -m torch_tpu.distributed.run``: ``torchrun`` on a TPU slice, configured from the VM.

Run the same command on every host of the slice (``gcloud ... tpu-vm ssh --worker=all``)::

    python -m torch_tpu.distributed.run train.py --lr 3e-4

Each host starts one process per chip: ``--nnodes`` (the hosts), ``--node-rank`` (this host's
``TPU_WORKER_ID``), ``--nproc-per-node`` (its chips), ``--master-addr`` (worker 0) and
``--master-port`` (``--master-port`` if given, else 8470; JAX's coordinator takes the next port)
come from the environment (:class:`torch_tpu.distributed.topology.Slice`); any other torchrun
option is passed on (``--max-restarts 1``...). Each process then sees only its own chip (the
variables of :func:`topology.process_environment`, set before JAX starts its TPU backend).
Outside a TPU slice (no ``TPU_WORKER_HOSTNAMES``) the command is plain ``torchrun``.
"""

from __future__ import annotations

import os
import sys

from .topology import CHIP_PER_PROCESS, DEFAULT_PORT, Slice


def torchrun_args(argv: list[str], slice_: Slice | None):
    """torchrun's parsed arguments for this launcher's ``argv``, completed from ``slice_``."""
    from torch.distributed import run as torchrun

    args = torchrun.parse_args(argv)
    if slice_ is None:
        return args
    defaults = torchrun.parse_args([args.training_script])
    for name in ("nnodes", "node_rank", "nproc_per_node", "master_addr"):
        if getattr(args, name) != getattr(defaults, name):
            raise SystemExit(
                f"torch_tpu.distributed.run: --{name.replace('_', '-')} comes from the TPU VM's "
                "environment (TPU_WORKER_ID, TPU_WORKER_HOSTNAMES, TPU_CHIPS_PER_HOST_BOUNDS); "
                "run torchrun itself to choose it"
            )
    given = torchrun.parse_args(
        [*slice_.torchrun_args(args.master_port or DEFAULT_PORT), args.training_script]
    )
    for name in ("nnodes", "node_rank", "nproc_per_node", "master_addr", "master_port"):
        setattr(args, name, getattr(given, name))
    return args


def main(argv: list[str] | None = None) -> None:
    from torch.distributed import run as torchrun

    slice_ = Slice.from_environment()
    args = torchrun_args(list(sys.argv[1:] if argv is None else argv), slice_)
    if slice_ is not None:
        os.environ[CHIP_PER_PROCESS] = "1"
    torchrun.run(args)


if __name__ == "__main__":
    main()
