"""torchao 0.18.0 on tpu, unmodified: float8 training (``convert_to_float8_training``, eager and
``torch.compile``) of the demo GPT, and weight-quantized inference (int8 and float8 weight-only,
int8 dynamic) of a tiny Llama with ``generate()``, each against the same run on CPU.

Tolerances come from the float64 reference: quantization's own error ``E`` (the CPU run against
the unquantized model in float64). tpu and CPU cast to float8 and int8 with the same rounding, so
the runs differ by float32 sums taken in another order, far below ``E`` until one moves a value
across a rounding boundary. A tpu that skipped the quantization would be ``E`` away from CPU;
one that quantized with wrong scales, further still."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import torch_tpu  # noqa: F401
from torch_tpu.demo.model import GPT, GPTConfig

torchao = pytest.importorskip("torchao")
from torchao.float8 import Float8LinearConfig, convert_to_float8_training  # noqa: E402
from torchao.quantization import (  # noqa: E402
    Float8WeightOnlyConfig,
    Int8DynamicActivationInt8WeightConfig,
    Int8WeightOnlyConfig,
    quantize_,
)

CONFIG = GPTConfig(vocab_size=96, block_size=32, n_layer=2, n_head=4, n_embd=64)  # (dims: 16k)


def _gpt(recipe: str | None = None) -> nn.Module:
    """The demo GPT (2 transformer blocks), its linears Float8Linear for ``recipe``."""
    torch.manual_seed(0)
    model = GPT(CONFIG)
    if recipe is not None:
        convert_to_float8_training(model, config=Float8LinearConfig.from_recipe_name(recipe))
    return model


def _losses(model: nn.Module, device: str, dtype=torch.float32, compiled=False, steps=4) -> torch.Tensor:
    """``steps`` AdamW steps of next-token prediction on one batch; the losses, in float64."""
    model = model.to(device, dtype)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    generator = torch.Generator().manual_seed(1)
    idx, targets = (torch.randint(0, 96, (8, 32), generator=generator).to(device) for _ in range(2))
    step = torch.compile(model, backend="tpu") if compiled else model
    losses = []
    for _ in range(steps):
        _, loss = step(idx, targets)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(float(loss.detach()))
    return torch.tensor(losses, dtype=torch.float64)


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise"])
def test_float8_training_of_a_transformer_matches_cpu(recipe, compiled):
    exact = _losses(_gpt(), "cpu", torch.float64)
    cpu = _losses(_gpt(recipe), "cpu")
    tpu = _losses(_gpt(recipe), "tpu", compiled=compiled)
    error = (cpu - exact).abs()  # float8's own error: measured 2e-4 to 3e-3
    assert torch.all(error > 1e-5), error
    # The first loss (one forward of the same weights): float32 sums in another order only
    # (measured: 1e-6 to 1e-5).
    assert abs(tpu[0] - cpu[0]) <= error[0] / 10, (tpu, cpu, error)
    # Later steps: a float32 sum taken in another order can move a value across a float8
    # rounding boundary, after which the runs part by a fraction of float8's error. The bound:
    # tpu no further from the float64 run than twice the CPU float8 run is (measured: up to
    # 1.4 times), and truly in float8 (a quarter of float8's error away from float64).
    assert torch.all((tpu - exact).abs() <= 2 * error), (tpu, cpu, exact)
    assert float((tpu - exact).abs().max()) >= float(error.max()) / 4, (tpu, exact)


def _llama() -> nn.Module:
    from torch_tpu.testing.hf_zoo import build

    return build("llama").eval()  # (2 layers, hidden 32, grouped-query attention, vocab 128)


PROMPT = torch.tensor([[1, 5, 9, 17, 33, 65, 3, 100]])
QUANTIZATIONS = {
    "int8_weight_only": Int8WeightOnlyConfig,
    "float8_weight_only": Float8WeightOnlyConfig,
    "int8_dynamic": Int8DynamicActivationInt8WeightConfig,
}


def _generate(quantization: str | None, device: str, dtype=torch.float32):
    model = _llama().to(dtype)
    if quantization:
        quantize_(model, QUANTIZATIONS[quantization]())
    model = model.to(device)
    with torch.no_grad():
        tokens = model.generate(PROMPT.to(device), max_new_tokens=8, do_sample=False)
        logits = model(PROMPT.to(device)).logits
    return tokens.cpu(), logits.cpu().double()


@pytest.mark.parametrize("quantization", list(QUANTIZATIONS))
def test_quantized_llama_generates_as_on_cpu(quantization):
    _, exact = _generate(None, "cpu", torch.float64)
    cpu_tokens, cpu = _generate(quantization, "cpu")
    tpu_tokens, tpu = _generate(quantization, "tpu")
    assert torch.equal(tpu_tokens, cpu_tokens)
    error = float((cpu - exact).abs().max())  # the quantization's: measured 5e-3 to 2e-2
    assert float((tpu - exact).abs().max()) >= error / 4  # (tpu quantized too)
    if quantization == "int8_dynamic":
        # Activations are rounded to int8 at run time: a float32 difference of 1 ulp upstream can
        # move one activation across a rounding boundary, one quantization step, which moves the
        # logits by a fraction of E. The bound: tpu no further from float64 than twice CPU's.
        assert float((tpu - exact).abs().max()) <= 2 * error
    else:
        assert float((tpu - cpu).abs().max()) <= error / 100  # measured: 2e-7


def test_weight_quantized_tensors_stay_quantized_on_tpu():
    """``quantize_``'s tensor subclasses move to tpu with their int8 and float8 data."""
    for quantization, storage in (
        ("int8_weight_only", torch.int8),
        ("float8_weight_only", torch.float8_e4m3fn),
    ):
        model = _llama()
        quantize_(model, QUANTIZATIONS[quantization]())
        weight = model.to("tpu").model.layers[0].mlp.up_proj.weight
        assert weight.device.type == "tpu" and weight.qdata.device.type == "tpu"
        assert weight.qdata.dtype == storage


def test_the_precision_docs_example_runs(capsys):
    import pathlib

    text = (pathlib.Path(__file__).parents[1] / "docs" / "precision.md").read_text()
    (snippet,) = [
        p.split("```")[0] for p in text.split("## torchao")[1].split("\n## ")[0].split("```python\n")[1:]
    ]
    exec(compile(snippet, "docs/precision.md", "exec"), {})
    assert "torch.Size([4, 64])" in capsys.readouterr().out
