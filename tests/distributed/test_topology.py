"""A TPU slice's shape from its VM's environment (simulated: 2 hosts x 2 chips), the launcher's
torchrun arguments, each process's chip, and the mesh shapes that keep axes within hosts."""

from __future__ import annotations

import doctest

import pytest

from torch_tpu.distributed import run, topology
from torch_tpu.distributed.topology import Slice

VM = {
    "TPU_WORKER_ID": "1",
    "TPU_WORKER_HOSTNAMES": "t1v-w-0, t1v-w-1",
    "TPU_CHIPS_PER_HOST_BOUNDS": "2,1,1",
    "TPU_ACCELERATOR_TYPE": "v5litepod-4",
    "TPU_TOPOLOGY": "2x2",
}


def test_the_slice_from_the_environment():
    s = Slice.from_environment(VM)
    assert (s.worker_id, s.hostnames, s.chip_bounds, s.chips_per_host, s.hosts) == (
        1,
        ("t1v-w-0", "t1v-w-1"),
        (2, 1, 1),
        2,
        2,
    )
    assert (s.accelerator_type, s.topology) == ("v5litepod-4", "2x2")
    assert Slice.from_environment({}) is None  # (not a TPU VM)


@pytest.mark.parametrize(
    ("name", "value", "words"),
    [
        ("TPU_WORKER_ID", "2", "TPU_WORKER_ID=2 is not the index of one of the 2 hosts"),
        ("TPU_WORKER_ID", "one", "TPU_WORKER_ID='one' is not an integer"),
        ("TPU_CHIPS_PER_HOST_BOUNDS", "2,2", "is not three positive integers"),
    ],
)
def test_a_bad_environment_is_named(name, value, words):
    with pytest.raises(ValueError, match=words):
        Slice.from_environment({**VM, name: value})


def test_torchrun_arguments_one_process_per_chip_worker_zero_as_master():
    args = run.torchrun_args(
        ["--max-restarts", "1", "train.py", "--master-port", "9"], Slice.from_environment(VM)
    )
    assert (args.nnodes, args.node_rank, args.nproc_per_node, args.master_addr, args.master_port) == (
        "2",
        1,
        "2",
        "t1v-w-0",
        topology.DEFAULT_PORT,
    )
    assert (args.max_restarts, args.training_script, args.training_script_args) == (
        1,
        "train.py",
        ["--master-port", "9"],
    )
    assert run.torchrun_args(["--master-port=1234", "t.py"], Slice.from_environment(VM)).master_port == 1234
    plain = run.torchrun_args(["--nproc-per-node=3", "t.py"], None)  # (outside a slice: torchrun)
    assert plain.nproc_per_node == "3"
    with pytest.raises(SystemExit, match="--nproc-per-node comes from the TPU VM's environment"):
        run.torchrun_args(["--nproc-per-node=3", "t.py"], Slice.from_environment(VM))


def test_each_process_drives_its_own_chip():
    env = topology.process_environment(Slice.from_environment(VM), local_rank=1)
    assert env == {
        "TPU_CHIPS_PER_PROCESS_BOUNDS": "1,1,1",
        "TPU_PROCESS_BOUNDS": "2,2,1",
        "TPU_PROCESS_ADDRESSES": "t1v-w-0:8476,t1v-w-0:8477,t1v-w-1:8476,t1v-w-1:8477",
        "TPU_PROCESS_PORT": "8477",
        "TPU_VISIBLE_CHIPS": "1",
        "CLOUD_TPU_TASK_ID": "3",
    }
    with pytest.raises(ValueError, match="local rank 2 is not one of this host's 2 chips"):
        topology.process_environment(Slice.from_environment(VM), local_rank=2)
    launched = {**VM, "LOCAL_RANK": "0", topology.CHIP_PER_PROCESS: "1", "TPU_VISIBLE_CHIPS": "0"}
    topology.claim_chip(launched)
    assert (launched["CLOUD_TPU_TASK_ID"], launched["TPU_PROCESS_PORT"]) == ("2", "8476")
    alone = {**VM, "LOCAL_RANK": "0"}  # (not started by the launcher: left alone)
    topology.claim_chip(alone)
    assert "TPU_VISIBLE_CHIPS" not in alone


@pytest.mark.parametrize(
    ("shape", "per_host", "fits"),
    [
        ((2, 2), 2, True),  # tp within a host, dp across
        ((4,), 2, True),
        ((2, 4), 4, True),
        ((2, 2, 2), 4, True),
        ((2, 6), 4, False),  # an axis of 6 splits hosts of 4
        ((3, 2), 4, False),
    ],
)
def test_mesh_shapes_keep_axes_within_hosts(shape, per_host, fits):
    if fits:
        topology.check_mesh_shape(shape, per_host)
    else:
        with pytest.raises(ValueError, match="splits hosts of"):
            topology.check_mesh_shape(shape, per_host)


def test_doctests():
    assert doctest.testmod(topology).failed == 0
