"""Train an image classifier, a ResNet or a ViT, on the tpu device with AdamW.

The model is built from a config with random weights (nothing downloaded): Hugging Face
Transformers' ``ResNetForImageClassification`` or ``ViTForImageClassification`` by default,
timm's ``resnet18``/``resnet50`` or ``vit_tiny``/``vit_base`` with ``--library timm`` (timm needs
a CPU torchvision: docs/ecosystem.md). The images are synthetic: each class has a fixed random
pattern, and an image is its class's pattern under fresh noise, so the loss falls within a few
steps. The first step's loss is also computed on CPU, in float32 and float64, from the same
weights and batch. Run it with::

    python examples/image_classifier.py --model resnet
    python examples/image_classifier.py --model vit --steps 50
    python examples/image_classifier.py --model resnet --full --image-size 224 --batch-size 64 \\
        --steps 200 --lr 1e-3
    python examples/image_classifier.py --model vit --full --library timm --image-size 224 \\
        --batch-size 64 --steps 200 --lr 1e-4

(``--full`` builds the library's full-size model instead of a tiny one: ResNet-50 and ViT-B/16,
23.5M and 85.8M parameters with 10 classes.) It prints the loss every few steps; the exit status
is non-zero when the loss did not fall or the first step's loss on tpu differs from CPU's by more
than float32 rounding.
"""

from __future__ import annotations

import argparse
import copy
import sys
from collections.abc import Sequence

import torch
import torch.nn.functional as F
import transformers
from _common import loss_fell, matches_cpu, parse_training_args
from torch import nn

DEVICE = "tpu"


class Logits(nn.Module):
    """A Transformers image classifier as ``images -> logits`` (timm's models already are)."""

    def __init__(self, model: transformers.PreTrainedModel) -> None:
        super().__init__()
        self.model = model

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.model(pixel_values=images).logits


def transformers_model(args: argparse.Namespace) -> nn.Module:
    """Transformers' ResNet or ViT: the config's defaults (ResNet-50, ViT-B/16) with ``--full``,
    else a two-stage ResNet or a two-layer ViT."""
    if args.model == "resnet":
        tiny = dict(embedding_size=16, hidden_sizes=[16, 32], depths=[1, 1], layer_type="basic")
        config = transformers.ResNetConfig(num_labels=args.classes, **({} if args.full else tiny))
        return Logits(transformers.ResNetForImageClassification(config))
    tiny = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64)
    patch = 16 if args.full else max(args.image_size // 4, 1)
    config = transformers.ViTConfig(
        image_size=args.image_size, patch_size=patch, num_labels=args.classes, **({} if args.full else tiny)
    )
    return Logits(transformers.ViTForImageClassification(config))


def timm_model(args: argparse.Namespace) -> nn.Module:
    """timm's ResNet or ViT, tiny unless ``--full``; exits with the reason when timm does not import."""
    try:
        import timm
    except Exception as error:  # noqa: BLE001  (a CUDA torchvision raises RuntimeError at import)
        sys.exit(
            f"--library timm: timm does not import ({type(error).__name__}: {error}); it needs a CPU "
            "torchvision, see docs/ecosystem.md#torchvision-and-timm, or use --library transformers"
        )
    if args.model == "resnet":
        return timm.create_model("resnet50" if args.full else "resnet18", num_classes=args.classes)
    name = "vit_base_patch16_224" if args.full else "vit_tiny_patch16_224"
    patch = 16 if args.full else max(args.image_size // 4, 1)
    return timm.create_model(name, num_classes=args.classes, img_size=args.image_size, patch_size=patch)


def patterns(args: argparse.Namespace) -> torch.Tensor:
    """One fixed random image per class: what the classifier has to recognize under the noise."""
    generator = torch.Generator().manual_seed(1)
    return torch.randn(args.classes, 3, args.image_size, args.image_size, generator=generator)


def batches(args: argparse.Namespace) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """``args.steps`` (images, labels) batches on CPU: each image its class's pattern plus noise."""
    templates, generator = patterns(args), torch.Generator().manual_seed(2)
    result = []
    for _ in range(args.steps):
        labels = torch.randint(args.classes, (args.batch_size,), generator=generator)
        noise = torch.randn(templates[labels].shape, generator=generator)
        result.append((templates[labels] + noise, labels))
    return result


def train(model: nn.Module, data: list, lr: float) -> list[float]:
    """AdamW over ``data`` on tpu; the losses (read back every few steps, printed)."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    losses = []
    for step, (images, labels) in enumerate(data, 1):
        loss = F.cross_entropy(model(images.to(DEVICE)), labels.to(DEVICE))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.detach())
        if step == 1 or step % max(len(data) // 10, 1) == 0:
            print(f"step {step:4d}  loss {losses[-1].item():.4f}", flush=True)
    return [loss.item() for loss in losses]


def first_loss_on_cpu(model: nn.Module, batch: tuple, dtype: torch.dtype) -> torch.Tensor:
    """The first step's loss, computed by a CPU copy of ``model`` in ``dtype``."""
    images, labels = batch
    return F.cross_entropy(copy.deepcopy(model).to(dtype)(images.to(dtype)), labels).detach()


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=["resnet", "vit"], default="resnet", help="(resnet)")
    parser.add_argument("--library", choices=["transformers", "timm"], default="transformers")
    parser.add_argument("--full", action="store_true", help="the full-size model (ResNet-50, ViT-B/16)")
    parser.add_argument("--steps", type=int, default=30, help="training steps (30)")
    parser.add_argument("--batch-size", type=int, default=16, help="images per step (16)")
    parser.add_argument("--image-size", type=int, default=32, help="image height and width (32)")
    parser.add_argument("--classes", type=int, default=10, help="classes (10)")
    parser.add_argument("--lr", type=float, default=3e-3, help="AdamW learning rate (3e-3)")
    return parse_training_args(parser, argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    torch.manual_seed(0)
    model = (timm_model if args.library == "timm" else transformers_model)(args).train()
    data = batches(args)
    on_cpu = [first_loss_on_cpu(model, data[0], dtype) for dtype in (torch.float32, torch.float64)]
    model.to(DEVICE)
    parameters = sum(p.numel() for p in model.parameters())
    print(f"training {args.library} {args.model}: {parameters:,} parameters on {DEVICE}")
    losses = train(model, data, args.lr)
    learned = loss_fell(losses, max(len(losses) // 5, 1))  # (batches differ: first and last fifths)
    alike = matches_cpu("first step's loss", torch.tensor(losses[0]), *on_cpu)
    return learned or alike


if __name__ == "__main__":
    sys.exit(main())
