"""Recurrent modules train on tpu as on CPU: ``nn.LSTM``, ``nn.GRU``, ``nn.RNN`` (tanh, relu) and
the ``*Cell`` modules, multi-layer, bidirectional, batch-first, with and without packed
sequences. Each case trains a few steps on CPU, on CPU in float64 (for the tolerances, see
``torch_tpu.testing.reference``) and on tpu from the same weights and batches; losses, weights
and gradients must match. The recurrent code is PyTorch's own composite (``aten::lstm`` and
friends); tpu lowers the fused LSTM/GRU cells it calls for a non-CPU device (``ops/rnn.py``)."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

import torch_tpu
from torch_tpu.testing.reference import assert_matches_cpu

STEPS = 4
BATCH, TIME, FEATURES, HIDDEN, CLASSES = 3, 5, 4, 6, 3
LENGTHS = torch.tensor([5, 2, 4])  # unsorted: packing sorts and unsorts


class Sequence(nn.Module):
    """A recurrent module read out by a linear head at every time step; ``packed`` feeds it a
    ``PackedSequence`` of ``LENGTHS`` and pads the result back."""

    def __init__(self, rnn: nn.RNNBase, packed: bool = False):
        super().__init__()
        self.rnn, self.packed = rnn, packed
        directions = 2 if rnn.bidirectional else 1
        self.head = nn.Linear(directions * (rnn.proj_size or rnn.hidden_size), CLASSES)

    def forward(self, x):
        if self.packed:
            packed = pack_padded_sequence(x, LENGTHS, batch_first=self.rnn.batch_first, enforce_sorted=False)
            out, _ = pad_packed_sequence(self.rnn(packed)[0], batch_first=self.rnn.batch_first)
        else:
            out = self.rnn(x)[0]
        return self.head(out)


class Unrolled(nn.Module):
    """A ``*Cell`` module stepped over time (the LSTM cell carries (h, c))."""

    def __init__(self, cell: nn.RNNCellBase):
        super().__init__()
        self.cell, self.head = cell, nn.Linear(cell.hidden_size, CLASSES)

    def forward(self, x):
        state, outputs = None, []
        for step in x.unbind(1):
            state = self.cell(step, state)
            outputs.append(state[0] if isinstance(state, tuple) else state)
        return self.head(torch.stack(outputs, 1))


MODELS = {
    "lstm": lambda: Sequence(nn.LSTM(FEATURES, HIDDEN, num_layers=2, bidirectional=True, batch_first=True)),
    "lstm_proj": lambda: Sequence(nn.LSTM(FEATURES, HIDDEN, batch_first=True, proj_size=2)),
    "gru": lambda: Sequence(nn.GRU(FEATURES, HIDDEN, num_layers=2, bidirectional=True, batch_first=True)),
    "rnn_relu": lambda: Sequence(nn.RNN(FEATURES, HIDDEN, nonlinearity="relu", batch_first=True)),
    "lstm_packed": lambda: Sequence(
        nn.LSTM(FEATURES, HIDDEN, num_layers=2, bidirectional=True, batch_first=True), packed=True
    ),
    "gru_packed_time_major": lambda: Sequence(nn.GRU(FEATURES, HIDDEN, bias=False), packed=True),
    "rnn_tanh_packed": lambda: Sequence(
        nn.RNN(FEATURES, HIDDEN, num_layers=2, bidirectional=True, batch_first=True), packed=True
    ),
    "lstm_cell": lambda: Unrolled(nn.LSTMCell(FEATURES, HIDDEN)),
    "gru_cell": lambda: Unrolled(nn.GRUCell(FEATURES, HIDDEN)),
    "rnn_cell": lambda: Unrolled(nn.RNNCell(FEATURES, HIDDEN, nonlinearity="relu")),
}


def _batches(time_major: bool) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """One random batch, seen at every step, so that the loss falls within a few steps."""
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(BATCH, TIME, FEATURES, generator=generator)
    y = torch.randint(CLASSES, (BATCH, TIME), generator=generator)
    return [(x.transpose(0, 1), y.t()) if time_major else (x, y)] * STEPS


def _train(model: nn.Module, batches, device: str, dtype=torch.float32, mode: str = "strict"):
    with torch_tpu.eager_mode(mode):
        return _steps(copy.deepcopy(model).to(device, dtype), batches, device, dtype)


def _steps(model: nn.Module, batches, device: str, dtype):
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    losses = []
    for x, y in batches:
        logits = model(x.to(device, dtype))
        loss = F.cross_entropy(logits.flatten(0, -2), y.to(device).flatten())
        optimizer.zero_grad()
        loss.backward()
        grads = {name: p.grad.detach().cpu() for name, p in model.named_parameters()}
        optimizer.step()
        losses.append(loss.detach())
    state = {name: value.detach().cpu() for name, value in model.state_dict().items()}
    return torch.stack(losses).cpu(), grads, state


# every case in strict eager; in fused eager (whole steps as graphs, which cost seconds to
# compile) one of each kind: a packed multi-layer LSTM, a GRU, an unrolled cell
CASES = [("strict", name) for name in MODELS] + [
    ("fused", name) for name in ("lstm_packed", "gru", "gru_cell")
]


@pytest.mark.filterwarnings("ignore:LSTM with projections is not supported with oneDNN")  # CPU's
@pytest.mark.parametrize(("mode", "name"), CASES)
def test_training_matches_cpu(mode, name):
    torch.manual_seed(0)
    model = MODELS[name]()
    rnn = getattr(model, "rnn", None)
    batches = _batches(time_major=rnn is not None and not rnn.batch_first)
    cpu, exact, tpu = (
        _train(model, batches, "cpu"),
        _train(model, batches, "cpu", torch.float64),
        _train(model, batches, "tpu", mode=mode),
    )
    assert cpu[0][-1] < cpu[0][0], "the reference run did not learn"
    assert_matches_cpu(tpu[0], cpu[0], exact[0], "losses")
    for what in (1, 2):  # the last step's gradients, the final weights
        assert tpu[what].keys() == cpu[what].keys()
        for key, value in cpu[what].items():
            assert_matches_cpu(tpu[what][key], value, exact[what][key], key)


def test_used_lstm_moves_to_tpu_and_back():
    """A module whose forward output (and graph) is still alive moves in place, as on CUDA,
    then trains on tpu like its CPU twin."""
    torch.manual_seed(0)
    model = Sequence(nn.LSTM(FEATURES, HIDDEN, num_layers=2, bidirectional=True, batch_first=True))
    twin = copy.deepcopy(model)
    x, y = _batches(time_major=False)[0]
    kept = model(x)
    params = list(model.parameters())
    model.to("tpu")
    assert list(model.parameters()) == params
    assert all(a is b for a, b in zip(model.rnn._flat_weights, model.rnn.parameters()))
    losses = []
    for m, device in ((model, "tpu"), (twin, "cpu")):
        loss = F.cross_entropy(m(x.to(device)).flatten(0, 1), y.to(device).flatten())
        loss.backward()
        losses.append(loss)
    torch.testing.assert_close(losses[0].cpu(), losses[1])
    model.cpu()
    assert all(p.device.type == "cpu" and p.grad.device.type == "cpu" for p in model.parameters())
    for p, q in zip(model.parameters(), twin.parameters()):
        torch.testing.assert_close(p.grad, q.grad)
    torch.testing.assert_close(model(x), kept)


@pytest.mark.parametrize("cell", [nn.LSTMCell, nn.GRUCell])
def test_cell_double_backward_matches_cpu(cell):
    """With ``create_graph=True`` autograd differentiates PyTorch's composite cell backward
    instead of the fused one; both must agree with CPU."""
    torch.manual_seed(0)
    module, x = cell(FEATURES, HIDDEN).double(), torch.randn(BATCH, FEATURES, dtype=torch.float64)
    results = []
    for device in ("cpu", "tpu"):
        m = copy.deepcopy(module).to(device)
        inputs = x.to(device).requires_grad_()
        out = m(inputs)
        out = out[0] + out[1] if isinstance(out, tuple) else out
        (grad,) = torch.autograd.grad(out.square().sum(), inputs, create_graph=True)
        grad.sum().backward()
        results.append([grad.detach().cpu()] + [p.grad.cpu() for p in m.parameters()])
    for tpu, cpu in zip(*results):
        torch.testing.assert_close(tpu, cpu)
