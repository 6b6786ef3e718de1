"""Target of the ``torch.backends`` entry point: ``import torch`` loads torch_tpu through it.

A module of its own so the hook resolves even while ``torch_tpu`` itself is mid-import (``import
torch_tpu`` imports torch, which runs the entry points before torch_tpu has finished).
"""


def load() -> None:
    import torch_tpu  # noqa: F401
