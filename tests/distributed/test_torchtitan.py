"""TorchTitan 0.2.2, unmodified, trains its llama3 ``debugmodel`` with FSDP (``dp_shard=2``) under
``torchrun --nproc-per-node 2`` on tpu (``python -m torchtitan.train``, configuration only), and
its losses equal the same job's on CPU/gloo.

The tokenizer and dataset are built from ``titan/corpus.txt`` (the wheel ships neither); both
runs start from one seed checkpoint written by TorchTitan itself, since tpu's and CPU's random
generators draw different initial weights."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from .launch import torchrun

pytest.importorskip("triton")  # (TorchTitan's package __init__ imports it; see pyproject.toml)
for _module in ("torchtitan", "tokenizers", "datasets", "tensorboard"):
    if importlib.util.find_spec(_module) is None:
        pytest.skip(f"{_module} is not installed", allow_module_level=True)

from .titan import assets  # noqa: E402

#: float32's unit roundoff
U = 2.0**-24


def _ran(done) -> None:
    assert done.returncode == 0, f"exit {done.returncode}\n{done.stdout[-5000:]}\n{done.stderr[-20000:]}"


@pytest.mark.slow  # three TorchTitan launches: about 110 s on 2 cores
def test_llama3_debugmodel_fsdp_on_tpu_matches_cpu_gloo(tmp_path):
    jobs = assets.jobs(tmp_path)
    env = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "HF_DATASETS_CACHE": str(tmp_path / "hf")}
    cpu = {**env, "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"}  # (no tpu in the reference's processes)
    _ran(torchrun("titan_cpu.py", "--job.config_file", str(jobs["seed"]), nproc=1, **cpu))
    _ran(torchrun("titan_cpu.py", "--job.config_file", str(jobs["cpu"]), **cpu))
    done = torchrun("torchtitan.train", "--job.config_file", str(jobs["tpu"]), timeout=400, **env)
    _ran(done)
    assert "TPU capacity" in done.stdout + done.stderr  # (TorchTitan's device was tpu)

    def metric(run: str, tag: str) -> torch.Tensor:
        values = torch.tensor(assets.scalars(tmp_path / run, tag), dtype=torch.float64)
        assert len(values) == assets.STEPS
        return values

    # The losses: float32 sums taken in another order (XLA's kernels and reductions vs ATen's
    # on CPU) through forward, backward and 3 AdamW updates; torch.testing's float32 tolerance
    # (rtol 1.3e-6, atol 1e-5). Measured: at most 1 ulp apart.
    for tag in ("loss_metrics/global_avg_loss", "loss_metrics/global_max_loss"):
        torch.testing.assert_close(metric("tpu", tag), metric("cpu", tag), rtol=1.3e-6, atol=1e-5, msg=tag)
    # The gradient norm: CPU's float32 ``linalg.vector_norm`` sums the squares in sequence, whose
    # relative error is bounded by n * u for n terms (n: the largest local gradient shard, the
    # 2048 x 256 embeddings split over 2 ranks); XLA's tree reduction is far closer (measured:
    # tpu's norm is within 1e-7 of the float64 norm of the same gradients, CPU's 5.4e-5 off).
    # The bound still catches a gradient off by any factor (a reduction that sums or averages
    # twice), which the losses cannot show: AdamW's steps do not change with the gradients' scale.
    torch.testing.assert_close(
        metric("tpu", "grad_norm"), metric("cpu", "grad_norm"), rtol=2048 * 256 // 2 * U, atol=0
    )
