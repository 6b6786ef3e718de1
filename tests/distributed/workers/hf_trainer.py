"""``transformers.Trainer`` under ``torchrun``: Accelerate must find the ``tpu_dist`` group and wrap
the model in DDP by itself. Run as a script, every rank trains on its shard of each global batch
and rank 0 saves the losses and final parameters to ``argv[1]``; ``train`` is also what the test
runs in one process on the whole batch (and in float64 on CPU, for the tolerance).

Every sequence has the same length and no padding, so each rank's mean token loss has the same
weight and their mean is the whole batch's loss."""

from __future__ import annotations

import sys
import tempfile

import torch
import transformers

from torch_tpu.testing import hf_zoo

#: per-rank batch, ranks, optimizer steps, tokens per sequence
BATCH, WORLD, STEPS, SEQ = 2, 2, 4, 12


class Tokens(torch.utils.data.Dataset):
    """Random token sequences (no padding); the labels are the inputs (causal LM)."""

    def __init__(self) -> None:
        g = torch.Generator().manual_seed(3)
        self.ids = torch.randint(
            3, hf_zoo.ARCHITECTURES["llama"].config["vocab_size"], (32, SEQ), generator=g
        )

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def train(batch: int, dtype: torch.dtype = torch.float32, use_cpu: bool = False):
    """Losses (one per step) and final parameters (on CPU) of the Trainer's AdamW run."""
    model = hf_zoo.build("llama").to(dtype).train()
    with tempfile.TemporaryDirectory() as out:
        args = transformers.TrainingArguments(
            output_dir=out,
            per_device_train_batch_size=batch,
            max_steps=STEPS,
            learning_rate=1e-2,
            logging_steps=1,
            report_to=[],
            save_strategy="no",
            use_cpu=use_cpu,
            dataloader_drop_last=True,
        )
        trainer = transformers.Trainer(model=model, args=args, train_dataset=Tokens())
        trainer.train()
    losses = torch.tensor([e["loss"] for e in trainer.state.log_history if "loss" in e], dtype=torch.float64)
    params = {name: p.detach().cpu() for name, p in model.named_parameters()}
    return trainer, losses, params


if __name__ == "__main__":
    import torch.distributed as dist

    trainer, losses, params = train(BATCH)
    args = trainer.args
    assert args.parallel_mode == transformers.training_args.ParallelMode.DISTRIBUTED, args.parallel_mode
    assert (args.world_size, args.device) == (WORLD, torch.device("tpu", 0)), (args.world_size, args.device)
    assert dist.get_backend() == "tpu_dist", dist.get_backend()
    wrapped = trainer.model_wrapped
    assert isinstance(wrapped, torch.nn.parallel.DistributedDataParallel), type(wrapped)
    assert {p.device.type for p in params.values()} == {"cpu"}
    checks = 0
    for name, p in params.items():  # the replicas stay identical
        both = [torch.empty_like(p, device="tpu") for _ in range(WORLD)]
        dist.all_gather(both, p.to("tpu"))
        assert torch.equal(both[0].cpu(), both[1].cpu()), f"{name} differs between the ranks"
        checks += 1
    rank = dist.get_rank()
    if rank == 0:
        torch.save({"losses": losses, "params": params}, sys.argv[1])
    print(f"rank {rank} ok {checks}", flush=True)
