"""FSDP2 on tpu against one process, and distributed checkpointing across a restart."""

from __future__ import annotations

from .launch import checks_passed, torchrun


def test_fsdp2_matches_one_process():
    assert checks_passed(torchrun("fsdp.py")) == [35, 35]


def test_checkpoint_of_an_fsdp2_model_and_optimizer_across_a_restart(tmp_path):
    """One run trains, saves (``torch.distributed.checkpoint``) and trains on; a second run loads
    the checkpoint and must take the same steps, loss for loss."""
    record = tmp_path / "record.pt"
    assert checks_passed(torchrun("checkpoint.py", "save", str(tmp_path), str(record))) == [1, 1]
    assert checks_passed(torchrun("checkpoint.py", "load", str(tmp_path), str(record))) == [2, 2]
