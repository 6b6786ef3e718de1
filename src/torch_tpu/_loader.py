"""``torch_tpu._loader.load()``: the entry point Ray Train (2.60) calls on its TPU workers to make
the tpu device and the ``"tpu_dist"`` process-group backend available."""

from __future__ import annotations


def load() -> None:
    import torch_tpu  # noqa: F401  (registers the device)

    from .distributed import register

    register()
