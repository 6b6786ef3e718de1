"""JAX's multi-process runtime under the tpu device: joined from the launcher's environment,
before JAX starts its backend.

Every process of a ``torchrun`` job is one JAX process (``process_id`` = ``RANK``): it drives its
local device(s), and ``tpu`` (``tpu:0``) is its first local device. XLA's collectives then run
across processes; on the CPU stand-in they travel over JAX's gloo CPU collectives. JAX can be
joined only before its backend starts, so the join happens either when ``init_process_group``
creates the first ``tpu_dist`` group (if the device has not started yet) or, when the device is
used first, at its start, from the environment ``torchrun`` sets (``RANK``, ``WORLD_SIZE``,
``MASTER_ADDR``, ``MASTER_PORT``). ``TORCH_TPU_DISTRIBUTED=0`` keeps such processes single-process
JAX (for jobs whose ranks use tpu on their own and talk over another backend).

JAX's coordinator listens on ``MASTER_PORT + 1`` of ``MASTER_ADDR`` (``torchrun``'s own store holds
``MASTER_PORT``); ``TORCH_TPU_COORDINATOR_PORT`` chooses another port.
"""

from __future__ import annotations

import datetime
import os
import socket

from .. import config
from ..runtime import platform

#: How long joining waits for every process by default (JAX's own default).
DEFAULT_JOIN_TIMEOUT = datetime.timedelta(seconds=300)


class Environment:
    """The launcher's description of this process's place in the job."""

    def __init__(self, environ=os.environ) -> None:
        self.rank = _int(environ, "RANK")
        self.world_size = _int(environ, "WORLD_SIZE")
        self.master_addr = environ.get("MASTER_ADDR")
        master_port = _int(environ, "MASTER_PORT")
        port = config.coordinator_port
        self.coordinator_port = port if port is not None else (master_port + 1 if master_port else None)
        self.enabled = config.distributed

    def is_multi_process(self) -> bool:
        return self.enabled and self.world_size is not None and self.world_size > 1 and self.rank is not None

    def coordinator(self) -> str:
        if not self.master_addr or self.coordinator_port is None:
            raise RuntimeError(
                "tpu_dist: JAX's multi-process runtime needs MASTER_ADDR and MASTER_PORT in the "
                "environment (torchrun sets them; with torch.multiprocessing set them yourself)"
            )
        return f"{self.master_addr}:{self.coordinator_port}"


def free_port_pair(host: str = "127.0.0.1") -> int:
    """A port ``p`` of ``host`` with ``p`` and ``p + 1`` free: a ``--master-port`` for launching
    on one machine (torchrun's store listens on ``p``, JAX's coordinator on ``p + 1``).

    >>> port = free_port_pair()  # torchrun --master-port=<port> ...
    """
    for _ in range(50):
        with socket.socket() as s:
            s.bind((host, 0))
            port = s.getsockname()[1]
        try:
            with socket.socket() as s:
                s.bind((host, port + 1))
            return port
        except OSError:
            continue
    raise RuntimeError("no free pair of consecutive ports")


def _int(environ, name: str) -> int | None:
    value = environ.get(name)
    if value in (None, ""):
        return None
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"tpu_dist: {name}={value!r} is not an integer") from None


def is_joined() -> bool:
    import jax._src.distributed as jax_distributed

    return jax_distributed.global_state.client is not None


def join(rank: int, world_size: int, timeout: datetime.timedelta = DEFAULT_JOIN_TIMEOUT, store=None) -> None:
    """Make this process JAX process ``rank`` of ``world_size`` (once; the device must not have
    started). Waits up to ``timeout`` for every process to join. The coordinator's address comes
    from the environment, else (given the group's ``store``) from rank 0 through the store."""
    import jax
    from jax._src import xla_bridge

    if is_joined():
        _check_place(rank, world_size)
        return
    if xla_bridge.backends_are_initialized():
        raise RuntimeError(
            "tpu_dist: JAX's backend started before JAX's multi-process runtime was joined (JAX "
            "was used directly before the first tpu use); create the process group, or use tpu, "
            "before any other JAX computation in this process"
        )
    coordinator = _coordinator(rank, store, timeout)
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    # JAX's preemption service catches SIGTERM (a notice to checkpoint and stop in step); under
    # torchrun, SIGTERM is how the agent stops the workers of a failed attempt, which must end
    jax.config.update("jax_enable_preemption_service", False)
    seconds = max(1, int(timeout.total_seconds()))
    try:
        jax.distributed.initialize(
            coordinator, num_processes=world_size, process_id=rank, initialization_timeout=seconds
        )
    except Exception as e:
        raise RuntimeError(
            f"tpu_dist: rank {rank} could not join JAX's multi-process runtime at {coordinator} "
            f"with {world_size} processes within {seconds} s (a rank that never started, or the "
            f"coordinator port is taken): {e}"
        ) from e


def _coordinator(rank: int, store, timeout: datetime.timedelta) -> str:
    """JAX's coordinator address: the launcher's (``MASTER_ADDR``, ``MASTER_PORT + 1``) or, when
    the group met without them (a ``file://`` or ``tcp://`` init method, as vLLM's workers do),
    a free port of rank 0's host (``MASTER_ADDR``, else this host's loopback: one machine) that
    rank 0 posts on the store."""
    env = Environment()
    if store is None or (env.master_addr and env.coordinator_port is not None):
        return env.coordinator()
    key = "tpu_dist/coordinator"
    if rank == 0:
        host = env.master_addr or "127.0.0.1"
        with socket.socket() as s:
            s.bind((host, 0))
            store.set(key, f"{host}:{s.getsockname()[1]}")
    store.wait([key], timeout)
    return store.get(key).decode()


def _check_place(rank: int, world_size: int) -> None:
    import jax

    if (jax.process_index(), jax.process_count()) != (rank, world_size):
        raise RuntimeError(
            f"tpu_dist: this process is JAX process {jax.process_index()} of {jax.process_count()} "
            f"but rank {rank} of {world_size} in torch.distributed; RANK and WORLD_SIZE must be "
            "the same for both"
        )


def join_from_environment() -> None:
    """``platform.before_start`` hook: join when the launcher says this is one of several
    processes."""
    env = Environment()
    if env.is_multi_process() and not is_joined():
        join(env.rank, env.world_size)


def ensure_joined(rank: int, world_size: int, timeout: datetime.timedelta, store=None) -> None:
    """For the default ``tpu_dist`` group: this process is JAX process ``rank`` of ``world_size``,
    joining now if the device has not started (a one-process group needs nothing); ``store``: the
    group's, to agree on the coordinator without the launcher's environment."""
    if world_size == 1 and not platform.is_initialized():
        return
    if not platform.is_initialized():
        join(rank, world_size, timeout, store)
        platform.initialize()
        return
    if world_size > 1 and not is_joined():
        raise RuntimeError(
            "tpu_dist: the tpu device started before this process joined JAX's multi-process "
            "runtime (it was used before init_process_group, without RANK/WORLD_SIZE/"
            "MASTER_ADDR/MASTER_PORT in the environment, or with TORCH_TPU_DISTRIBUTED=0); call "
            "init_process_group('tpu_dist') before the first tpu use, or launch with torchrun"
        )
    if world_size > 1:
        _check_place(rank, world_size)


def rank_devices(global_ranks) -> tuple:
    """The JAX device of each rank (its process's first local device), in the order given."""
    import jax

    firsts: dict = {}
    for d in jax.devices():
        if d.process_index not in firsts or d.id < firsts[d.process_index].id:
            firsts[d.process_index] = d
    return tuple(firsts[r] for r in global_ranks)
