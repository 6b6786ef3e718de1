"""``Module.to("tpu")`` / ``.cpu()`` move parameters in place, as ``.to("cuda")`` does: the same
Parameter objects (ties and optimizers kept), ``.grad`` moved with them, and it works while a
forward's output, and so the autograd graph holding the parameters, is still alive."""

from __future__ import annotations

import pytest
import torch
from torch import nn


class _TiedLM(nn.Module):
    """An embedding and an output head sharing one weight, like GPT's."""

    def __init__(self):
        super().__init__()
        self.embedding = nn.Embedding(7, 4)
        self.body = nn.Sequential(nn.Linear(4, 4), nn.Tanh())
        self.head = nn.Linear(4, 7, bias=False)
        self.head.weight = self.embedding.weight

    def forward(self, tokens):
        return self.head(self.body(self.embedding(tokens)))


def _model() -> _TiedLM:
    torch.manual_seed(0)
    return _TiedLM()


TOKENS = torch.tensor([[1, 2, 3], [4, 5, 6]])


def test_move_keeps_parameter_objects_and_ties_with_a_live_graph():
    model = _model()
    params = list(model.parameters())
    expected = model(TOKENS)
    kept = model(TOKENS)  # its graph holds every parameter (AccumulateGrad and saved tensors)
    model.to("tpu")
    assert list(model.parameters()) == params and all(p.device.type == "tpu" for p in params)
    assert model.head.weight is model.embedding.weight
    on_tpu = model(TOKENS.to("tpu"))
    model.cpu()
    assert list(model.parameters()) == params and all(p.device.type == "cpu" for p in params)
    assert model.head.weight is model.embedding.weight
    torch.testing.assert_close(on_tpu.cpu(), expected)
    torch.testing.assert_close(model(TOKENS), expected, rtol=0, atol=0)
    assert kept.grad_fn is not None


def test_move_carries_gradients_and_an_optimizer_keeps_working():
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    reference = _model()
    reference_optimizer = torch.optim.SGD(reference.parameters(), lr=0.1)
    for m in (model, reference):
        m(TOKENS).square().mean().backward()
    model.to("tpu")
    for p, r in zip(model.parameters(), reference.parameters()):
        assert p.grad.device.type == "tpu"
        torch.testing.assert_close(p.grad.cpu(), r.grad, rtol=0, atol=0)
    optimizer.step()  # built before the move: it holds the moved Parameter objects
    reference_optimizer.step()
    for p, r in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(p.detach().cpu(), r.detach())


def test_backward_through_a_graph_recorded_before_the_move():
    """As on CUDA, the old graph is left alone: tensors it saved (views such as Linear's
    ``weight.t()``) keep the values they had, gradients reach the moved parameter on the device
    the graph ran on, and a parameter the graph saved itself now holds the moved value, so that
    backward mixes devices and raises PyTorch's device-mismatch error."""
    linear = nn.Linear(3, 2)
    loss = linear(torch.ones(4, 3)).sum()
    linear.to("tpu")
    loss.backward()
    assert linear.weight.device.type == "tpu" and linear.weight.grad.device.type == "cpu"
    torch.testing.assert_close(linear.weight.grad, torch.full((2, 3), 4.0))

    scale = nn.Parameter(torch.ones(3))
    x = torch.ones(3, requires_grad=True)
    loss = (x * scale).sum()  # mul saves the leaf itself for x's gradient
    scale.data = scale.data.to("tpu")
    with pytest.raises(RuntimeError, match="same device"):
        loss.backward()


def test_state_dict_round_trip_after_moves():
    model = _model()
    kept = model(TOKENS)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    model.to("tpu")
    model(TOKENS.to("tpu")).sum().backward()
    model.cpu()
    reloaded = _TiedLM()
    reloaded.load_state_dict(model.state_dict())
    for name, value in reloaded.state_dict().items():
        torch.testing.assert_close(value, state[name], rtol=0, atol=0)
    assert kept.grad_fn is not None


@pytest.mark.parametrize(
    ("a", "b", "expected"),
    [
        ("tpu", "cpu", True),
        ("cpu", "tpu", True),
        ("tpu", "tpu", True),
        ("tpu", "meta", False),  # as cuda and meta: meta is not a dense backend of this rule
    ],
)
def test_has_compatible_shallow_copy_type(a, b, expected):
    tensors = torch.zeros(2, device=a), torch.zeros(2, device=b)
    assert torch._has_compatible_shallow_copy_type(*tensors) is expected


def test_sparse_is_not_shallow_copy_compatible_with_tpu():
    sparse = torch.zeros(2, 2).to_sparse()
    assert not torch._has_compatible_shallow_copy_type(torch.zeros(2, 2, device="tpu"), sparse)
