"""``torch.compile(backend="tpu")``: Dynamo graphs run through the eager lowerings, fused."""
from __future__ import annotations

import copy

import pytest
import torch

from torch_tpu.models import GPT, GPTConfig


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def test_compiled_training_step_matches_cpu():
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=16, block_size=8, n_layer=1, n_head=2, n_embd=16))
    tokens = torch.randint(0, 16, (2, 8), generator=torch.Generator().manual_seed(1))
    targets = tokens.roll(1, 1)
    cpu = copy.deepcopy(model)
    _, cpu_loss = cpu(tokens, targets=targets)
    cpu_loss.backward()
    tpu = copy.deepcopy(model).to("tpu")
    compiled = torch.compile(tpu, backend="tpu")
    for _ in range(2):  # the second call reuses the compiled graphs
        tpu.zero_grad()
        _, loss = compiled(tokens.to("tpu"), targets=targets.to("tpu"))
        loss.backward()
    torch.testing.assert_close(loss.cpu(), cpu_loss, rtol=1e-5, atol=1e-6)
    for (name, expected), actual in zip(cpu.named_parameters(), tpu.parameters()):
        torch.testing.assert_close(actual.grad.cpu(), expected.grad, rtol=1e-4, atol=1e-6,
                                   msg=lambda m: f"{name}: {m}")


def test_graph_breaks_run_each_piece():
    def f(x):
        y = torch.sin(x) * 2
        if y.sum().item() > 0:  # a host read: Dynamo breaks the graph here
            y = y + 1
        return torch.cos(y)

    x = torch.linspace(0, 1, 8)
    torch.testing.assert_close(torch.compile(f, backend="tpu")(x.to("tpu")).cpu(), f(x))


def test_transformers_static_cache_generation_compiles_on_tpu():
    """Transformers compiles generation with backend "tpu" for a static KV cache."""
    pytest.importorskip("transformers")
    from torch_tpu.testing import hf_zoo
    model = hf_zoo.build("llama")
    feed = hf_zoo.inputs("llama")
    options = dict(max_new_tokens=8, do_sample=False, cache_implementation="static")
    expected = model.generate(**feed, **options)
    tpu = copy.deepcopy(model).to("tpu")
    generated = tpu.generate(**{k: v.to("tpu") for k, v in feed.items()}, **options)
    assert torch.equal(generated.cpu(), expected)
