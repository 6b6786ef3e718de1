"""TorchTitan 0.2.2, unmodified, trains its llama3 ``debugmodel`` with FSDP (``dp_shard=2``) under
``torchrun --nproc-per-node 2`` on tpu (``python -m torchtitan.train``, configuration only), and
its losses equal the same job's on CPU/gloo; so do its losses with TorchTitan's float8 converter
(torchao's ``Float8Linear``) within float8's error, and on 4 ranks with FSDP x tensor
parallelism and FSDP x pipeline parallelism.

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


ENV = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
CPU = {**ENV, "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"}  # (no tpu in the reference's processes)


def _ran(done) -> None:
    assert done.returncode == 0, f"exit {done.returncode}\n{done.stdout[-5000:]}\n{done.stderr[-20000:]}"


class Runs:
    """The jobs of ``assets.jobs`` under one folder: the seed checkpoint and the plain CPU
    reference run once; each other run on demand."""

    def __init__(self, folder):
        self.folder, self.jobs = folder, assets.jobs(folder)
        self.env = {"HF_DATASETS_CACHE": str(folder / "hf")}
        self.run("seed")
        self.run("cpu")

    def run(self, name: str) -> None:
        config = ("--job.config_file", str(self.jobs[name]))
        nproc = assets.ranks(name)
        if name.startswith("tpu"):
            done = torchrun("torchtitan.train", *config, nproc=nproc, timeout=400, **ENV, **self.env)
            _ran(done)
            assert "TPU capacity" in done.stdout + done.stderr  # (TorchTitan's device was tpu)
        else:
            _ran(torchrun("titan_cpu.py", *config, nproc=nproc, **CPU, **self.env))

    def metric(self, run: str, tag: str) -> torch.Tensor:
        values = torch.tensor(assets.scalars(self.folder / run, tag), dtype=torch.float64)
        assert len(values) == assets.STEPS
        return values


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return Runs(tmp_path_factory.mktemp("titan"))


LOSSES = ("loss_metrics/global_avg_loss", "loss_metrics/global_max_loss")


@pytest.mark.slow  # three TorchTitan launches: about 110 s on 2 cores
def test_llama3_debugmodel_fsdp_on_tpu_matches_cpu_gloo(runs):
    runs.run("tpu")
    # The losses: float32 sums taken in another order (XLA's kernels and reductions vs ATen's
    # on CPU) through forward, backward and 3 AdamW updates; torch.testing's float32 tolerance
    # (rtol 1.3e-6, atol 1e-5). Measured: at most 1 ulp apart.
    for tag in LOSSES:
        torch.testing.assert_close(
            runs.metric("tpu", tag), runs.metric("cpu", tag), rtol=1.3e-6, atol=1e-5, msg=tag
        )
    _grad_norms_close(runs.metric("tpu", "grad_norm"), runs.metric("cpu", "grad_norm"))


def _grad_norms_close(got: torch.Tensor, want: torch.Tensor) -> None:
    # CPU's float32 ``linalg.vector_norm`` sums the squares in sequence, whose relative error is
    # bounded by n * u for n terms (n: the largest local gradient shard, the 2048 x 256
    # embeddings split over 2 ranks); XLA's tree reduction is far closer (measured: tpu's norm is
    # within 1e-7 of the float64 norm of the same gradients, CPU's 5.4e-5 off). The bound still
    # catches a gradient off by any factor (a reduction that sums or averages twice), which the
    # losses cannot show: AdamW's steps do not change with the gradients' scale.
    torch.testing.assert_close(got, want, rtol=2048 * 256 // 2 * U, atol=0)


@pytest.mark.slow  # two 4-rank TorchTitan launches: about 60 s on 2 cores
def test_llama3_debugmodel_fsdp_x_tp_on_4_ranks_matches_cpu_gloo(runs):
    """A 2-D mesh (``dp_shard=2, tp=2``): FSDP over one axis, DTensor's tensor parallelism over
    the other, both as ``tpu_dist`` subgroups; the same global batch as the FSDP run."""
    runs.run("tpu_tp")
    for tag in LOSSES:  # (tolerance: as the FSDP run's)
        torch.testing.assert_close(
            runs.metric("tpu_tp", tag), runs.metric("cpu", tag), rtol=1.3e-6, atol=1e-5, msg=tag
        )
    _grad_norms_close(runs.metric("tpu_tp", "grad_norm"), runs.metric("cpu", "grad_norm"))


@pytest.mark.slow  # two 4-rank TorchTitan launches: about 60 s on 2 cores
def test_llama3_debugmodel_fsdp_x_pp_on_4_ranks_matches_cpu_gloo(runs):
    """FSDP x pipeline parallelism (``dp_shard=2, pp=2``, TorchTitan's 1F1B schedule): the
    stages' activations and gradients travel by ``batch_isend_irecv``, each stage sending before
    it receives. The losses equal the FSDP run's; TorchTitan's pipelined gradient norm is its
    own (about 250x the FSDP run's on CPU as well), so it is compared with the same job on gloo."""
    runs.run("tpu_pp")
    runs.run("cpu_pp")
    for tag in LOSSES:
        torch.testing.assert_close(
            runs.metric("tpu_pp", tag), runs.metric("cpu", tag), rtol=1.3e-6, atol=1e-5, msg=tag
        )
    _grad_norms_close(runs.metric("tpu_pp", "grad_norm"), runs.metric("cpu_pp", "grad_norm"))


@pytest.mark.slow  # two more TorchTitan launches (and the references if on another worker)
def test_llama3_debugmodel_float8_fsdp_on_tpu_matches_cpu_gloo(runs):
    runs.run("cpu_float8")
    runs.run("tpu_float8")
    for tag in LOSSES:
        plain, cpu, tpu = (runs.metric(run, tag) for run in ("cpu", "cpu_float8", "tpu_float8"))
        error = (cpu - plain).abs()  # float8's own: measured 4e-4 to 3e-3 per step
        assert float(error.min()) > 1e-5, (tag, error)
        # Both runs cast with the same rounding, but a float32 sum taken in another order can
        # move a value across a float8 rounding boundary (one float8 step, 1/16 of it), after
        # which the runs part by a fraction of float8's error (measured: up to a quarter). The
        # bound: tpu no further from the float32 run than twice the CPU float8 run is, at each
        # step; and tpu truly in float8 (a quarter of float8's error away from float32).
        assert torch.all((tpu - plain).abs() <= 2 * error), (tag, tpu, cpu, plain)
        assert float((tpu - plain).abs().max()) >= float(error.max()) / 4, (tag, tpu, plain)
