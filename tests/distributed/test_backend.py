"""The ``"tpu_dist"`` backend is registered with the device (no JAX imported), is the default for
tpu tensors, is what ``torch_tpu._loader.load()`` (Ray Train's entry point) provides, and runs a
one-process group in this process."""

from __future__ import annotations

import json

import pytest
import torch
import torch.distributed as dist


def test_registered_at_import_without_jax(run_python):
    out = run_python("""
        import json, sys, torch, torch.distributed as dist
        print(json.dumps({
            "default": dist.Backend.default_device_backend_map.get("tpu"),
            "listed": "tpu_dist" in dist.Backend.backend_list,
            "for_device": dist.get_default_backend_for_device("tpu"),
            "jax": "jax" in sys.modules,
        }))
    """)
    assert json.loads(out) == {"default": "tpu_dist", "listed": True, "for_device": "tpu_dist", "jax": False}


def test_loader_registers_the_backend(run_python):
    out = run_python(
        """
        import sys, torch_tpu._loader as loader, torch.distributed as dist
        loader.load()
        print(dist.Backend.default_device_backend_map.get("tpu"), "jax" in sys.modules)
        """,
        TORCH_DEVICE_BACKEND_AUTOLOAD="0",
    )
    assert out.split() == ["tpu_dist", "False"]


@pytest.fixture
def one_process_group():
    dist.init_process_group("tpu_dist", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield dist.group.WORLD
    finally:
        dist.destroy_process_group()


def test_a_one_process_group(one_process_group):
    t = torch.arange(4.0, device="tpu")
    dist.all_reduce(t, dist.ReduceOp.MAX)
    out = torch.empty(4, device="tpu")
    dist.all_gather_into_tensor(out, t)
    work = dist.broadcast(t, 0, async_op=True)
    assert work.wait() and work.is_completed()
    assert one_process_group.name() == "tpu_dist"
    torch.testing.assert_close(out.cpu(), torch.arange(4.0))
    torch.testing.assert_close(t.cpu(), torch.arange(4.0))
    objects = [None]
    dist.all_gather_object(objects, {"a": 1})
    assert objects == [{"a": 1}]
    with pytest.raises(ValueError, match="one device type"):
        dist.all_gather([torch.empty(4)], t)


def test_collectives_in_fused_eager(one_process_group):
    """Pending fused work is run before a collective reads its input, and its output is an
    ordinary write that later fused ops see."""
    import torch_tpu

    x = torch.arange(6.0, device="tpu")
    with torch_tpu.eager_mode("fused"):
        y = x * 2 + 1
        dist.all_reduce(y, dist.ReduceOp.SUM)
        z = y.view(2, 3).sum(0)
        out = torch.empty(6, device="tpu")
        dist.all_gather_into_tensor(out[:3], z)
    torch.testing.assert_close(out[:3].cpu(), (torch.arange(6.0) * 2 + 1).view(2, 3).sum(0))


def test_several_processes_need_the_runtime_joined_before_the_device_starts():
    torch.ones(1, device="tpu")  # the device has started, as a one-process JAX runtime
    with pytest.raises(RuntimeError, match="before this process joined JAX's multi-process runtime"):
        dist.init_process_group("tpu_dist", store=dist.HashStore(), rank=0, world_size=2)
    assert not dist.is_initialized()


def test_a_launched_rank_answers_to_its_local_rank(run_python):
    """Under ``torchrun``, CUDA code names a rank's device ``cuda:LOCAL_RANK`` (TorchTitan's
    trainer, PyTorch's ``DeviceMesh``); a rank that drives one tpu answers to ``tpu:LOCAL_RANK``
    as to ``tpu:0``, and refuses any other index."""
    code = """
        import torch
        torch.tpu.set_device("tpu:{rank}")
        x = torch.arange(3.0).to("tpu:{rank}")
        made = [x, torch.ones(2, device="tpu:{rank}"), torch.tensor([1], device=torch.device("tpu", {rank}))]
        print([str(t.device) for t in made], torch.tpu.current_device(), x.cpu().tolist())
        print(torch.tpu.memory_stats("tpu:{rank}")["allocated_bytes.all.current"] >= 0)
        with torch.tpu.device({rank}):
            print(torch.zeros(1, device="tpu").device)
        try:
            torch.ones(1, device="tpu:{other}")
        except RuntimeError as e:
            print("invalid device ordinal: tpu:{other}" in str(e))
    """
    want = ["['tpu:0', 'tpu:0', 'tpu:0'] 0 [0.0, 1.0, 2.0]", "True", "tpu:0", "True"]
    for rank, other in ((1, 2), (0, 1)):
        out = run_python(code.format(rank=rank, other=other), LOCAL_RANK=str(rank), TORCH_TPU_DISTRIBUTED="0")
        assert out.splitlines() == want, (rank, out)
