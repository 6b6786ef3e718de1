"""A TPU slice's shape, from its VM's environment, for launching and for device meshes.

A Cloud TPU VM (and a GKE TPU pod) describes its place in the slice in its environment:
``TPU_WORKER_ID`` (this host's index), ``TPU_WORKER_HOSTNAMES`` (every host, comma separated, in
worker order), ``TPU_CHIPS_PER_HOST_BOUNDS`` (this host's chips as ``x,y,z``), and
``TPU_ACCELERATOR_TYPE`` / ``TPU_TOPOLOGY`` (``v5litepod-16``, ``4x4``). :class:`Slice` reads
them; :meth:`Slice.torchrun_args` turns them into ``torchrun``'s (one process per chip, node
rank = worker id, rank 0's host as the master), which ``python -m torch_tpu.distributed.run``
passes on; :func:`process_environment` gives each process its chip (JAX's variables for several
processes per host), and :func:`device_mesh` builds a ``DeviceMesh`` whose last axes run within a
host (ICI, the fast links) and whose first run across hosts.

>>> env = {"TPU_WORKER_ID": "1", "TPU_WORKER_HOSTNAMES": "h0,h1", "TPU_CHIPS_PER_HOST_BOUNDS": "2,1,1"}
>>> Slice.from_environment(env).torchrun_args(port=8470)
['--nnodes=2', '--node-rank=1', '--nproc-per-node=2', '--master-addr=h0', '--master-port=8470']
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Mapping, Sequence

#: torchrun's store port when the launcher is given none (JAX's coordinator takes the next one)
DEFAULT_PORT = 8470
#: the first of the ports the processes of a host use among themselves (JAX's TPU runtime)
PROCESS_PORT = 8476
#: set by the launcher for the processes it starts: each takes the chip of its ``LOCAL_RANK``
CHIP_PER_PROCESS = "TORCH_TPU_CHIP_PER_PROCESS"


@dataclasses.dataclass(frozen=True)
class Slice:
    """This host's place in a TPU slice."""

    worker_id: int
    hostnames: tuple[str, ...]
    chip_bounds: tuple[int, int, int]  # this host's chips along x, y, z
    accelerator_type: str | None = None
    topology: str | None = None

    @classmethod
    def from_environment(cls, environ: Mapping[str, str] = os.environ) -> Slice | None:
        """The slice the environment describes, or None outside a TPU VM (no
        ``TPU_WORKER_HOSTNAMES``)."""
        hostnames = environ.get("TPU_WORKER_HOSTNAMES")
        if not hostnames:
            return None
        hosts = tuple(h.strip() for h in hostnames.split(",") if h.strip())
        worker = _integer(environ, "TPU_WORKER_ID", "0")
        if not 0 <= worker < len(hosts):
            raise ValueError(f"TPU_WORKER_ID={worker} is not the index of one of the {len(hosts)} hosts")
        bounds = environ.get("TPU_CHIPS_PER_HOST_BOUNDS", "1,1,1")
        try:
            chips = tuple(int(b) for b in bounds.split(","))
        except ValueError:
            chips = ()
        if len(chips) != 3 or min(chips) < 1:
            raise ValueError(f"TPU_CHIPS_PER_HOST_BOUNDS={bounds!r} is not three positive integers")
        return cls(worker, hosts, chips, environ.get("TPU_ACCELERATOR_TYPE"), environ.get("TPU_TOPOLOGY"))

    @property
    def chips_per_host(self) -> int:
        return math.prod(self.chip_bounds)

    @property
    def hosts(self) -> int:
        return len(self.hostnames)

    def torchrun_args(self, port: int = DEFAULT_PORT) -> list[str]:
        """torchrun's options for this host: one process per chip, node rank = worker id (so
        a host's ranks are consecutive), worker 0 as the master."""
        return [
            f"--nnodes={self.hosts}",
            f"--node-rank={self.worker_id}",
            f"--nproc-per-node={self.chips_per_host}",
            f"--master-addr={self.hostnames[0]}",
            f"--master-port={port}",
        ]


def process_environment(slice_: Slice, local_rank: int) -> dict[str, str]:
    """The variables that make process ``local_rank`` of this host drive its one chip (JAX's
    recipe for several processes per host: each sees one chip, and knows every process's
    address)."""
    if not 0 <= local_rank < slice_.chips_per_host:
        raise ValueError(f"local rank {local_rank} is not one of this host's {slice_.chips_per_host} chips")
    per_host = slice_.chips_per_host
    addresses = [f"{host}:{PROCESS_PORT + i}" for host in slice_.hostnames for i in range(per_host)]
    x, y, z = slice_.chip_bounds
    return {
        "TPU_CHIPS_PER_PROCESS_BOUNDS": "1,1,1",
        "TPU_PROCESS_BOUNDS": f"{x},{y * slice_.hosts},{z}",
        "TPU_PROCESS_ADDRESSES": ",".join(addresses),
        "TPU_PROCESS_PORT": str(PROCESS_PORT + local_rank),
        "TPU_VISIBLE_CHIPS": str(local_rank),
        "CLOUD_TPU_TASK_ID": str(slice_.worker_id * per_host + local_rank),
    }


def claim_chip(environ=os.environ) -> None:
    """``platform.before_start`` hook: in a process the launcher started on a TPU slice, set its
    chip's variables (:func:`process_environment`) before JAX starts its TPU backend (variables
    already set are kept)."""
    if environ.get(CHIP_PER_PROCESS) != "1" or environ.get("LOCAL_RANK") is None:
        return
    slice_ = Slice.from_environment(environ)
    if slice_ is not None:
        for name, value in process_environment(slice_, int(environ["LOCAL_RANK"])).items():
            environ.setdefault(name, value)


def device_mesh(
    shape: Sequence[int], mesh_dim_names: Sequence[str] | None = None, slice_: Slice | None = None
):
    """A ``DeviceMesh`` of ``shape`` over the job's ranks, its last axes within a host.

    torchrun numbers a host's processes consecutively, so a row-major mesh puts its innermost
    axes on one host as long as their sizes multiply to a divisor of the chips per host; this
    checks that (``slice_``: default, the environment's; outside a TPU slice, the ranks per
    node torchrun reports) and refuses a shape that would put an inner axis across hosts.

    >>> mesh = device_mesh((2, 2), ("dp", "tp"))  # dp across hosts, tp within one  # doctest: +SKIP
    """
    from torch.distributed.device_mesh import init_device_mesh

    check_mesh_shape(shape, _ranks_per_host(slice_ or Slice.from_environment()))
    names = tuple(mesh_dim_names) if mesh_dim_names else None
    return init_device_mesh("tpu", tuple(shape), mesh_dim_names=names)


def check_mesh_shape(shape: Sequence[int], per_host: int) -> None:
    """Raise ``ValueError`` unless a row-major mesh of ``shape`` over hosts of ``per_host``
    consecutive ranks keeps each axis within a host or spanning whole hosts: the innermost axes
    multiply to a divisor of ``per_host``, and the first axis past it to a multiple.

    >>> check_mesh_shape((2, 4), per_host=4)  # 4 in a host, 2 across hosts
    >>> check_mesh_shape((2, 6), per_host=4)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ValueError: device_mesh: a mesh of shape (2, 6) splits hosts of 4 chips unevenly: ...
    """
    inner = 1
    for size in reversed(shape):
        if per_host % (inner * size) == 0:
            inner *= size
        elif (inner * size) % per_host == 0:
            return  # (this axis is the first to cross hosts, whole hosts at a time)
        else:
            raise ValueError(
                f"device_mesh: a mesh of shape {tuple(shape)} splits hosts of {per_host} chips "
                "unevenly: its innermost axes must multiply to a divisor of the chips per host, "
                "and the next to a multiple (the fast, in-host axes innermost)"
            )


def _ranks_per_host(slice_: Slice | None) -> int:
    if slice_ is not None:
        return slice_.chips_per_host
    local = os.environ.get("LOCAL_WORLD_SIZE")
    return int(local) if local else 1


def _integer(environ: Mapping[str, str], name: str, default: str) -> int:
    value = environ.get(name, default)
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"{name}={value!r} is not an integer") from None
