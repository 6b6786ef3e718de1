"""``transformers.Trainer`` under ``torchrun --nproc-per-node 2`` on tpu: Accelerate finds the
``tpu_dist`` group and wraps the model in DDP by itself; the losses and final parameters equal
one process training on the whole batch, within the rounding that the one-process run itself
shows against the same run in float64 on CPU."""

from __future__ import annotations

import torch

from torch_tpu.testing.reference import derived_tolerance

from .launch import checks_passed, torchrun
from .workers import hf_trainer


def test_trainer_ddp_matches_one_process_on_the_whole_batch(tmp_path):
    saved = tmp_path / "rank0.pt"
    done = torchrun("hf_trainer.py", str(saved), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    whole = hf_trainer.BATCH * hf_trainer.WORLD
    _, losses, params = hf_trainer.train(whole)
    _, ref_losses, ref_params = hf_trainer.train(whole, torch.float64, use_cpu=True)
    assert checks_passed(done) == [len(params)] * 2  # every parameter equal on both ranks
    got = torch.load(saved)
    assert len(got["losses"]) == hf_trainer.STEPS
    pairs = [("losses", got["losses"], losses, ref_losses)]
    pairs += [(name, got["params"][name], p, ref_params[name]) for name, p in params.items()]
    for what, two_ranks, one_process, float64 in pairs:
        torch.testing.assert_close(
            two_ranks, one_process, **derived_tolerance(one_process, float64), msg=lambda m: f"{what}: {m}"
        )
