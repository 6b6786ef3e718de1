"""Train a Diffusers UNet as a DDPM on the tpu device, then sample from it.

A small ``UNet2DModel`` with attention learns to denoise 16x16 images of soft blobs (made on the
fly from a seed: nothing downloaded) with Diffusers' ``DDPMScheduler``, in plain PyTorch: noise,
predict it, MSE, AdamW. Then ``DDPMPipeline`` samples from the trained weights on tpu and on CPU
from the same noise. Run it with::

    python examples/diffusion.py
    python examples/diffusion.py --steps 500 --size 32

It prints the loss every few steps; the exit status is non-zero when the loss did not fall or
the tpu samples differ from CPU's.
"""

from __future__ import annotations

import argparse
import copy
import sys
from collections.abc import Sequence

import diffusers
import torch
import torch.nn.functional as F
from _common import loss_fell, parse_training_args, report

DEVICE = "tpu"


def blobs(count: int, size: int, generator: torch.Generator) -> torch.Tensor:
    """``count`` RGB images of one Gaussian blob each, in [-1, 1] (Diffusers' image range)."""
    centers = torch.rand(count, 2, 1, 1, generator=generator) * size
    widths = torch.rand(count, 1, 1, generator=generator) * size / 4 + size / 8
    colors = torch.rand(count, 3, 1, 1, generator=generator) * 2 - 1
    grid = torch.arange(size, dtype=torch.float32)
    distance = (grid[None, :, None] - centers[:, 0]) ** 2 + (grid[None, None, :] - centers[:, 1]) ** 2
    return colors * torch.exp(-distance / (2 * widths**2))[:, None]


def unet(size: int) -> diffusers.UNet2DModel:
    torch.manual_seed(0)
    return diffusers.UNet2DModel(
        sample_size=size,
        in_channels=3,
        out_channels=3,
        layers_per_block=1,
        block_out_channels=(32, 64),
        down_block_types=("DownBlock2D", "AttnDownBlock2D"),
        up_block_types=("AttnUpBlock2D", "UpBlock2D"),
        norm_num_groups=8,
    )


def train(model: diffusers.UNet2DModel, scheduler, args: argparse.Namespace) -> list[float]:
    """``args.steps`` denoising steps on fresh blobs; the losses."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    generator = torch.Generator().manual_seed(1)
    losses = []
    for step in range(1, args.steps + 1):
        images = blobs(args.batch_size, args.size, generator)
        noise = torch.randn(images.shape, generator=generator)
        timesteps = torch.randint(
            0, scheduler.config.num_train_timesteps, (args.batch_size,), generator=generator
        )
        noisy = scheduler.add_noise(images, noise, timesteps)
        predicted = model(noisy.to(DEVICE), timesteps.to(DEVICE)).sample
        loss = F.mse_loss(predicted, noise.to(DEVICE))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
        if step == 1 or step % max(args.steps // 10, 1) == 0:
            print(f"step {step:4d}  loss {losses[-1]:.4f}", flush=True)
    return losses


def sample(model: diffusers.UNet2DModel, scheduler, device: str, steps: int) -> torch.Tensor:
    pipe = diffusers.DDPMPipeline(unet=model.eval().to(device), scheduler=scheduler)
    pipe.set_progress_bar_config(disable=True)
    generator = torch.Generator().manual_seed(2)  # (noise drawn on CPU: the same for both)
    return pipe(batch_size=4, num_inference_steps=steps, generator=generator, output_type="pt").images.cpu()


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=60, help="training steps (60)")
    parser.add_argument("--size", type=int, default=16, help="image size (16)")
    parser.add_argument("--batch-size", type=int, default=16, help="images per step (16)")
    parser.add_argument("--lr", type=float, default=2e-3, help="AdamW learning rate (2e-3)")
    parser.add_argument("--sampling-steps", type=int, default=10, help="DDPM sampling steps (10)")
    return parse_training_args(parser, argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    scheduler = diffusers.DDPMScheduler(num_train_timesteps=100)
    model = unet(args.size).to(DEVICE).train()
    print(f"training {sum(p.numel() for p in model.parameters()):,} parameters on {DEVICE}")
    losses = train(model, scheduler, args)
    learned = loss_fell(losses, max(len(losses) // 5, 1))  # (steps are noisy: the first and last fifths)
    on_cpu = copy.deepcopy(model).cpu()
    tpu, cpu = (
        sample(model, scheduler, DEVICE, args.sampling_steps),
        sample(on_cpu, scheduler, "cpu", args.sampling_steps),
    )
    difference = float((tpu - cpu).abs().max())
    print(f"sampled {tuple(tpu.shape)} images on {DEVICE}; largest difference from CPU {difference:.1e}")
    # (images in [0, 1]: a quarter of an 8-bit level, 1/1020, is below what a saved image shows)
    alike = report(difference < 1 / 1020, "samples equal to CPU's within a quarter of an 8-bit level")
    return learned or alike


if __name__ == "__main__":
    sys.exit(main())
