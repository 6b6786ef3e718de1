"""What the workers share: starting the ``tpu_dist`` group next to a gloo group (the reference:
the same collective on CPU tensors), comparing results, counting checks."""

from __future__ import annotations

import datetime

import torch
import torch.distributed as dist

import torch_tpu  # noqa: F401  (registers tpu and "tpu_dist")


class Worker:
    def __init__(self, backend: str | None = "tpu_dist", timeout: float = 60, gloo: bool = True) -> None:
        dist.init_process_group(backend, timeout=datetime.timedelta(seconds=timeout))
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.gloo = dist.new_group(backend="gloo") if gloo else None
        self.checks = 0

    def same(self, got: torch.Tensor, want: torch.Tensor, what: str) -> None:
        """Equal values, dtype and shape (bit for bit for floats: -0.0 and NaN included)."""
        got = got.cpu()
        assert got.dtype == want.dtype and got.shape == want.shape, (
            f"rank {self.rank}: {what}: {got.dtype}{list(got.shape)} != {want.dtype}{list(want.shape)}"
        )
        if got.is_floating_point() and got.element_size() in (2, 4, 8):
            bits = {2: torch.int16, 4: torch.int32, 8: torch.int64}[got.element_size()]
            equal = torch.equal(got.view(bits), want.view(bits)) or torch.equal(got, want)
        else:
            equal = torch.equal(got, want)
        assert equal, f"rank {self.rank}: {what}:\n{got}\n!=\n{want}"
        self.checks += 1

    def raises(self, kind: type, words: list[str], fn, what: str) -> str:
        try:
            fn()
        except kind as e:
            message = str(e)
            for w in words:
                assert w in message, f"rank {self.rank}: {what}: {w!r} not in {message!r}"
            self.checks += 1
            return message
        raise AssertionError(f"rank {self.rank}: {what}: no {kind.__name__} raised")

    def collectives(self) -> int:
        """How many collectives this rank entered on the world group: one per eager
        collective, one per call of a compiled graph with collectives in it."""
        return dist.group.WORLD._ledger.entered.get(tuple(range(self.world)), 0)

    def done(self) -> None:
        dist.destroy_process_group()
        print(f"rank {self.rank} ok {self.checks}", flush=True)


def sharded_mlp(mesh, seed: int):
    """An MLP (8 -> 16 -> 4) under FSDP2 on ``mesh`` (per layer and root) and its Adam."""
    from torch import nn
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    for layer in (model[0], model[2]):
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    model.to("tpu")
    return model, torch.optim.Adam(model.parameters(), lr=0.01)
