"""timm 1.0.31 on tpu: a ResNet and a ViT training step against CPU. timm needs torchvision,
whose package-index build is CUDA's and fails to load beside CPU torch (``operator
torchvision::nms does not exist``); the tests skip, saying so, where torchvision is missing or
broken (a TPU VM installs the CPU build from PyTorch's index: docs/ecosystem.md)."""

from __future__ import annotations

import pytest
import torch

import torch_tpu  # noqa: F401
from torch_tpu.testing.reference import assert_matches_cpu


def _torchvision_problem() -> str | None:
    try:
        import torchvision  # noqa: F401
    except Exception as error:  # noqa: BLE001  (a CUDA build raises RuntimeError at import)
        return f"torchvision does not load ({type(error).__name__}: {error})"
    return None


if _torchvision_problem():
    pytest.skip(f"timm needs torchvision: {_torchvision_problem()}", allow_module_level=True)
timm = pytest.importorskip("timm")


def _step(name: str, device: str, dtype=torch.float32, **config):
    torch.manual_seed(0)
    model = timm.create_model(name, pretrained=False, num_classes=5, **config).to(device, dtype).train()
    generator = torch.Generator().manual_seed(1)
    images = torch.randn(2, 3, 32, 32, generator=generator).to(device, dtype)
    labels = torch.tensor([1, 4]).to(device)
    loss = torch.nn.functional.cross_entropy(model(images), labels)
    loss.backward()
    return loss.detach(), {n: p.grad for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize(
    "name, config", [("resnet18", {}), ("vit_tiny_patch16_224", {"img_size": 32, "patch_size": 8})]
)
def test_training_step_as_on_cpu(name, config):
    (tpu, tpu_grads), (cpu, cpu_grads), (reference, reference_grads) = (
        _step(name, "tpu", **config),
        _step(name, "cpu", **config),
        _step(name, "cpu", torch.float64, **config),
    )
    assert_matches_cpu(tpu, cpu, reference, "loss")
    for n, grad in tpu_grads.items():
        assert_matches_cpu(grad, cpu_grads[n], reference_grads[n], n)
