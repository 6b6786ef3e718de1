"""Diffusers 0.42.1 on tpu, unmodified, tiny models from configs: a DDPM pipeline (UNet with
attention), a DiT pipeline with classifier-free guidance (its VAE decoding the latents), and SD3's
transformer with a backward. Each against the same run on CPU, tolerances from a float64 CPU run
of the same computation (``testing.reference``)."""

from __future__ import annotations

import contextlib
import sys

import pytest
import torch

import torch_tpu  # noqa: F401
from torch_tpu.testing.reference import assert_matches_cpu

diffusers = pytest.importorskip("diffusers")
from diffusers.utils import torch_utils  # noqa: E402

_RANDN = torch_utils.randn_tensor


def _float32_noise(shape, generator=None, device=None, dtype=None, layout=None, **options):
    return _RANDN(
        shape, generator=generator, device=device, dtype=torch.float32, layout=layout, **options
    ).to(dtype)


@contextlib.contextmanager
def float32_noise():
    """Diffusers' noise drawn in float32 whatever the model's dtype (then converted): the float64
    reference must start from the float32 runs' noise, which a float64 draw does not give."""
    users = [
        m
        for n, m in list(sys.modules.items())
        if n.startswith("diffusers") and getattr(m, "randn_tensor", None) is _RANDN
    ]
    for module in users:
        module.randn_tensor = _float32_noise
    try:
        yield
    finally:
        for module in users:
            module.randn_tensor = _RANDN


def _three_runs(run):
    """``run(device, dtype)`` on tpu, on CPU, and on CPU in float64."""
    with float32_noise():
        return run("tpu", torch.float32), run("cpu", torch.float32), run("cpu", torch.float64)


def _ddpm(device, dtype):
    torch.manual_seed(0)
    unet = diffusers.UNet2DModel(
        sample_size=8,
        in_channels=3,
        out_channels=3,
        layers_per_block=1,
        block_out_channels=(16, 32),
        down_block_types=("DownBlock2D", "AttnDownBlock2D"),
        up_block_types=("AttnUpBlock2D", "UpBlock2D"),
        norm_num_groups=8,
    )
    scheduler = diffusers.DDPMScheduler(num_train_timesteps=20)
    pipe = diffusers.DDPMPipeline(unet=unet.eval().to(device, dtype), scheduler=scheduler)
    pipe.set_progress_bar_config(disable=True)
    generator = torch.Generator().manual_seed(0)  # (noise drawn on CPU, as the pipeline allows)
    return pipe(batch_size=2, num_inference_steps=4, generator=generator, output_type="pt").images


def test_ddpm_pipeline_samples_as_on_cpu():
    tpu, cpu, reference = _three_runs(_ddpm)
    assert tpu.shape == (2, 3, 8, 8)
    assert_matches_cpu(tpu, cpu, reference, "DDPM images")


def _dit(device, dtype):
    torch.manual_seed(0)
    transformer = diffusers.DiTTransformer2DModel(
        num_attention_heads=2,
        attention_head_dim=8,
        in_channels=4,
        out_channels=8,  # (the learned variance's half is dropped by the pipeline)
        num_layers=2,
        sample_size=4,
        patch_size=2,
        num_embeds_ada_norm=1000,  # (the pipeline's unconditional class is 1000, ImageNet's count)
        norm_num_groups=8,
    )
    vae = diffusers.AutoencoderKL(
        in_channels=3,
        out_channels=3,
        down_block_types=("DownEncoderBlock2D", "DownEncoderBlock2D"),
        up_block_types=("UpDecoderBlock2D", "UpDecoderBlock2D"),
        block_out_channels=(8, 16),
        latent_channels=4,
        norm_num_groups=8,
        sample_size=8,
    )
    pipe = diffusers.DiTPipeline(  # (eval: in training, DiT drops class labels at random)
        transformer=transformer.eval().to(device, dtype),
        vae=vae.eval().to(device, dtype),
        scheduler=diffusers.DDIMScheduler(),
    )
    pipe.set_progress_bar_config(disable=True)
    generator = torch.Generator().manual_seed(0)
    out = pipe(
        class_labels=[1, 7], guidance_scale=4.0, num_inference_steps=3, generator=generator, output_type="np"
    )
    return torch.from_numpy(out.images)


def test_dit_pipeline_with_classifier_free_guidance_as_on_cpu():
    tpu, cpu, reference = _three_runs(_dit)
    assert tpu.shape == (2, 8, 8, 3)
    assert_matches_cpu(tpu, cpu, reference, "DiT images")


def _sd3_step(device, dtype):
    torch.manual_seed(0)
    model = diffusers.SD3Transformer2DModel(
        sample_size=8,
        patch_size=2,
        in_channels=4,
        num_layers=2,
        attention_head_dim=8,
        num_attention_heads=2,
        joint_attention_dim=16,
        caption_projection_dim=16,
        pooled_projection_dim=8,
        out_channels=4,
        pos_embed_max_size=16,
    ).to(device, dtype)
    generator = torch.Generator().manual_seed(1)
    inputs = {
        "hidden_states": torch.randn(2, 4, 8, 8, generator=generator),
        "encoder_hidden_states": torch.randn(2, 5, 16, generator=generator),
        "pooled_projections": torch.randn(2, 8, generator=generator),
        "timestep": torch.tensor([3.0, 700.0]),
    }
    out = model(**{k: v.to(device, dtype) for k, v in inputs.items()}).sample
    out.pow(2).mean().backward()
    return out, {name: p.grad for name, p in model.named_parameters() if p.grad is not None}


def test_sd3_transformer_forward_and_backward_as_on_cpu():
    (tpu, tpu_grads), (cpu, cpu_grads), (reference, reference_grads) = _three_runs(_sd3_step)
    assert_matches_cpu(tpu, cpu, reference, "SD3 output")
    assert tpu_grads.keys() == cpu_grads.keys() and len(cpu_grads) > 20
    for name, grad in tpu_grads.items():
        assert_matches_cpu(grad, cpu_grads[name], reference_grads[name], name)


def test_the_ecosystem_docs_example_runs(capsys):
    import pathlib

    text = (pathlib.Path(__file__).parents[2] / "docs" / "ecosystem.md").read_text()
    section = text.split("## Example: Diffusers on tpu", 1)[1]
    snippet = section.split("```python\n", 1)[1].split("```", 1)[0]
    exec(compile(snippet, "docs/ecosystem.md", "exec"), {})
    assert "torch.Size([2, 3, 8, 8])" in capsys.readouterr().out
