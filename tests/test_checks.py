"""Value checks XLA cannot raise (index bounds...), in fused eager and compiled programs: reported
by the host read that depends on them, never by an unrelated op, and a failed step leaves
``.grad`` as it was."""

from __future__ import annotations

import gc
import weakref

import pytest
import torch
import torch.nn.functional as F

import torch_tpu
from torch_tpu import execution
from torch_tpu.runtime.context import context


def _bad_select():
    """An index_select reading index 9 of 4 elements (CPU raises "index out of range")."""
    return torch.index_select(torch.arange(4, device="tpu"), 0, torch.tensor([9], device="tpu"))


@pytest.mark.parametrize(
    "read",
    [
        lambda t: t.cpu(),
        lambda t: t.item(),
        lambda t: t.tolist(),
        repr,
        lambda t: (t + 1).sum().item(),  # a value computed from the bad one
        lambda t: torch.nonzero(t),  # an op that reads values on the host
        lambda t: torch.tpu.synchronize(),
        lambda t: t.expand(3).cpu(),  # (a view of a small storage: read through it on the host)
        lambda t: t.expand(2)[1].item(),
    ],
    ids=["cpu", "item", "tolist", "print", "derived", "nonzero", "synchronize", "view cpu", "view item"],
)
def test_every_host_read_of_a_checked_value_raises_there(read):
    with torch_tpu.eager_mode("fused"):
        selected = _bad_select()
        with pytest.raises(
            IndexError,
            match=r"index out of range in self \(raised by "
            r"aten\.index_select\.default at .*test_checks",
        ):
            read(selected)


def test_an_unrelated_op_or_read_never_raises_the_error():
    with torch_tpu.eager_mode("fused"):
        selected = _bad_select()
        other = torch.ones(3, device="tpu") * 2
        torch_tpu.execution.fused.flush("test")  # the failing graph has run
        assert other.sum().item() == 6.0  # unrelated: no error
        assert (other + 1).tolist() == [3.0, 3.0, 3.0]
        with pytest.raises(IndexError):
            selected.cpu()
        with pytest.raises(IndexError):  # the value stays wrong: it keeps raising
            selected.item()
    torch.tpu.synchronize()  # reported once already: synchronize does not raise it again


def test_synchronize_reports_a_check_nobody_read():
    with torch_tpu.eager_mode("fused"):
        _bad_select()  # dropped at once: its check still runs with the graph
        torch.ones(2, device="tpu").sum().item()
        with pytest.raises(IndexError, match="reported at synchronize"):
            torch.tpu.synchronize()
        torch.tpu.synchronize()


def test_index_ops_stay_in_the_fused_graph():
    """index_select & co. check their indices with the graph instead of ending it."""
    x = torch.arange(12.0, device="tpu").reshape(3, 4)
    index = torch.tensor([2, 0], device="tpu")
    calls = {
        "index_select": lambda: torch.index_select(x, 0, index),
        "index_add": lambda: x.index_add(0, index, torch.ones(2, 4, device="tpu")),
        "index_copy": lambda: x.index_copy(0, index, torch.ones(2, 4, device="tpu")),
        "index_fill": lambda: x.index_fill(1, index, -1.0),
        "take": lambda: torch.take(x, index),
        "put": lambda: x.put(index, torch.tensor([7.0, 8.0], device="tpu")),
        "scatter_reduce": lambda: x.scatter_reduce(
            0, index.reshape(2, 1).expand(2, 4), torch.ones(2, 4, device="tpu"), "sum"
        ),
        "index_reduce": lambda: x.index_reduce(0, index, torch.ones(2, 4, device="tpu"), "prod"),
    }
    for name, call in calls.items():
        expected = call().cpu()
        with torch_tpu.eager_mode("fused"):
            torch.tpu.reset_compilation_cache_stats()
            before = execution.pending_ops()
            result = call()
            assert execution.pending_ops() > before, f"{name} ran outside the graph"
            assert not torch.tpu.compilation_cache_stats()["sync_reasons"], name
            torch.testing.assert_close(result.cpu(), expected, msg=name)


@pytest.mark.parametrize(
    ("indices", "nodes"),
    [
        (lambda: torch.tensor([[1, 2, 3]], device="tpu"), 1),  # a batch: checked on its host copy
        (lambda: torch.arange(3, device="tpu"), 1),  # positions: an integer arange's host copy
        (lambda: torch.tensor([[1, 2], [3, 0]], device="tpu").t().reshape(-1), 2),  # computed: apart
    ],
    ids=["batch", "positions", "view"],
)
def test_a_check_over_indices_a_few_ops_compute_runs_apart_from_the_graph(indices, nodes):
    """The check is not a node of the fused graph (its own small program, or none: a host
    copy), so reporting it (at the end of backward()) does not wait for the step's forward and
    backward."""
    weight = torch.randn(5, 3, device="tpu")
    with torch_tpu.eager_mode("fused"):
        index = indices()
        before = execution.pending_ops()
        looked_up = F.embedding(index, weight) * 2
        assert execution.pending_ops() == before + nodes + 1  # (the lookup's nodes, the product)
        torch.testing.assert_close(looked_up.cpu(), F.embedding(indices().cpu(), weight.cpu()) * 2)


def test_a_check_over_indices_computed_from_large_inputs_stays_in_the_graph():
    """Computing the indices apart would compute them twice: not for a product of 2 MB inputs."""
    x, w = torch.randn(512, 512, device="tpu"), torch.randn(512, 512, device="tpu")
    weight = torch.randn(512, 3, device="tpu")
    with torch_tpu.eager_mode("fused"):
        index = (x @ w).argmax(-1)
        before = execution.pending_ops()
        looked_up = F.embedding(index, weight)
        assert execution.pending_ops() == before + 2  # the check's node, the lookup
        torch.testing.assert_close(looked_up.cpu(), F.embedding(index.cpu(), weight.cpu()))


@pytest.mark.parametrize(
    "indices",
    [
        lambda: torch.arange(7, device="tpu"),  # past the 5 rows (checked on its host copy)
        lambda: torch.arange(8, device="tpu").reshape(2, 4).t().reshape(-1) + 1,  # a view and an op
        lambda: (torch.arange(8, device="tpu") * 2 + 1 - 1).reshape(2, 4).sum(0).clamp(0, 9),  # recorded
    ],
    ids=["positions", "view", "many-ops"],
)
def test_a_failing_check_over_computed_indices_raises_at_the_read_naming_the_op(indices):
    weight = torch.randn(5, 3, device="tpu")
    with torch_tpu.eager_mode("fused"):
        looked_up = F.embedding(indices(), weight)
        other = weight * 2
        torch.testing.assert_close(other.cpu(), weight.cpu() * 2)  # unrelated: no error
        with pytest.raises(IndexError, match=r"index out of range in self \(raised by aten\.embedding"):
            looked_up.cpu()
    torch.tpu.synchronize()


@pytest.mark.parametrize("many_ops", [False, True], ids=["apart", "recorded"])
def test_checks_of_the_same_values_run_once_while_a_graph_records(many_ops, monkeypatch):
    """A decoder layer's cache update checks the positions it writes for the keys and again for
    the values: one check program for both (computed apart, or recorded), and each op still
    raises its error where a value depending on it is read."""
    from torch_tpu.execution import fused
    from torch_tpu.ops import _helpers

    programs = []
    computed_apart = fused.Graph.computed_apart

    def counted(self, fn, args):
        programs.append(fn)
        return computed_apart(self, fn, args)

    monkeypatch.setattr(fused.Graph, "computed_apart", counted)
    if many_ops:  # more ops than a check computes apart: the check is a node of the graph
        monkeypatch.setattr(fused, "APART_NODES", 0)

    def update(shift: int, device: str) -> tuple[torch.Tensor, torch.Tensor]:
        keys, values = torch.zeros(6, 2, device=device), torch.zeros(6, 2, device=device)
        shift = torch.tensor([shift + 0.0], device=device).long()  # (computed on the device)
        position = torch.arange(2, device=device) + shift
        keys.index_copy_(0, position, torch.ones(2, 2, device=device))
        values.index_copy_(0, position, torch.full((2, 2), 2.0, device=device))
        return keys, values

    with torch_tpu.eager_mode("fused"):
        keys, values = update(3, "tpu")
        assert len(programs) == 1
        recorded = [node for node in context.recorder.graph.nodes if node[0] is _helpers._first_out_of_bounds]
        assert len(recorded) == many_ops
        for got, expected in zip((keys, values), update(3, "cpu")):
            torch.testing.assert_close(got.cpu(), expected)
        keys, values = update(5, "tpu")  # positions 5 and 6 of 6 rows
        for written in (keys, values):
            with pytest.raises(IndexError, match=r"index_copy_\(\): index 6 is out of bounds"):
                written.cpu()
    torch.tpu.synchronize()


@pytest.fixture
def device_checks(monkeypatch) -> list:
    """A list that grows by one at each bounds check run by a program on the device."""
    from torch_tpu.ops import _helpers

    run = []
    checked_on_device = _helpers._first_out_of_bounds
    monkeypatch.setattr(_helpers, "_first_out_of_bounds", lambda *a: run.append(1) or checked_on_device(*a))
    return run


@pytest.mark.parametrize("mode", ["strict", "fused"])
def test_indices_copied_from_the_host_are_checked_on_the_host(mode, device_checks):
    """No program runs for the bounds check of a batch copied from the host, a view of one or
    an integer ``arange``: their host copy is read. Indices computed on the device (or changed
    there) are checked by a program."""
    weight = torch.randn(5, 3, device="tpu")
    with torch_tpu.eager_mode(mode):
        host = torch.tensor([4, 0])
        index = host.to("tpu")
        host[0] = 9  # the host tensor changes after the copy, the device value does not
        torch.testing.assert_close(F.embedding(index, weight).cpu(), weight.cpu()[[4, 0]])
        assert not device_checks
        with pytest.raises(IndexError, match="index out of range in self"):
            F.embedding(torch.tensor([[1, 5]], device="tpu"), weight).cpu()
        batch = torch.tensor([[0, 1], [2, 3]], device="tpu")
        for view in (batch.view(-1), batch.t(), batch[1:, 1]):
            F.embedding(view, weight).cpu()  # a view of a batch from the host: its copy's view
        F.embedding(torch.arange(1, 5, device="tpu"), weight).cpu()  # positions
        with pytest.raises(IndexError, match="index out of range in self"):
            F.embedding(torch.arange(6, device="tpu").view(2, 3).t(), weight).cpu()
        for rows in (torch.tensor([0, 4]), torch.arange(40) % 5):  # few entries, and more
            rows = rows.to("tpu")
            F.embedding(rows, weight).cpu()  # (its range, read once, meets each size)
            with pytest.raises(IndexError, match="index out of range in self"):
                F.embedding(rows, weight[:4]).cpu()
            with pytest.raises(IndexError, match="index 4 is out of bounds for dimension 0 with size 4"):
                weight[:4][rows].cpu()
        assert not device_checks
        index.copy_((index + 1.0).long())  # now 5 and 1, computed on the device (from floats,
        # which keep no host copy): its old host copy is not used
        with pytest.raises(IndexError, match="index out of range in self"):
            F.embedding(index, weight).cpu()
        assert device_checks
    torch.tpu.synchronize()


@pytest.mark.parametrize("mode", ["strict", "fused"])
def test_positions_summed_from_host_copies_are_checked_on_the_host(mode, device_checks):
    """A static cache's positions (``arange + length``, then ``length.add_``, as Transformers'
    ``StaticLayer.update`` computes them at every step) keep a host copy computed by numpy
    (``Lowering.host``), so their bounds check runs no program; a position past the cache still
    raises PyTorch's error. The values equal CPU's."""

    def decode(device: str, steps: int) -> torch.Tensor:
        cache = torch.zeros(1, 2, 6, 3, device=device)
        length = torch.tensor(0).to(device)
        for step in range(steps):
            positions = torch.arange(1, device=device) + length
            length.add_(1)
            cache.index_copy_(2, positions, torch.full((1, 2, 1, 3), float(step), device=device))
            cache.sum().item()  # (a step's host read: its graph runs)
        return cache

    with torch_tpu.eager_mode(mode):
        torch.testing.assert_close(decode("tpu", 6).cpu(), decode("cpu", 6))
        assert not device_checks
        with pytest.raises(IndexError, match=r"index_copy_\(\): index 6 is out of bounds for dimension 2"):
            decode("tpu", 7)
    torch.tpu.synchronize()
    assert not device_checks


@pytest.mark.parametrize("mode", ["strict", "fused"])
def test_a_host_rule_keeps_the_device_result_wrapping_included(mode):
    """Where an op with a host rule keeps a host copy it equals the value the device computed
    (integer wrapping included); a number outside the dtype (which PyTorch wraps first), a
    float result, or an operand computed on the device keeps none."""
    from torch_tpu.ops import dispatch
    from torch_tpu.runtime import tensor

    near_max = torch.tensor([2**31 - 2, -(2**31), 5], dtype=torch.int32)
    cases = {
        "int32 overflow": lambda x, y, u: x + x,
        "alpha": lambda x, y, u: torch.sub(x, y, alpha=3),
        "a 0-dim CPU operand": lambda x, y, u: y + torch.tensor(7),
        "uint8 wrap": lambda x, y, u: u - 200,
        "in place": lambda x, y, u: y.clone().add_(x, alpha=-2),
        "int64 and bool": lambda x, y, u: y + torch.tensor([True, False, True]).to(y.device),
    }
    with torch_tpu.eager_mode(mode):
        x, y = near_max.to("tpu"), torch.tensor([3, -4, 2**40]).to("tpu")
        u = torch.tensor([1, 100, 255], dtype=torch.uint8).to("tpu")
        for name, op in cases.items():
            got = op(x, y, u)
            kept = tensor.host_value(got)
            assert kept is not None, name
            expected = op(near_max, y.cpu(), u.cpu())
            assert kept.tolist() == expected.tolist() == got.cpu().tolist(), name
            assert tensor.host_value(got) is not None, name  # (still, once its graph ran)
        long_range = torch.arange(dispatch.HOST_SHADOW_ELEMENTS + 1, device="tpu")
        assert tensor.host_value(long_range) is not None  # (a range: it has one)
        for _ in range(2):  # (the Python kernel, then the C++ core's plan)
            for name, result in {
                "past int32": x + 2**40,
                "float": y + 0.5,
                "computed on the device": x.neg() + x,
                "more elements than HOST_SHADOW_ELEMENTS": long_range + 1,
            }.items():
                assert tensor.host_value(result) is None, name
        torch.testing.assert_close((x + 2**40).cpu(), near_max + 2**40)


def test_host_copies_are_kept_for_small_integer_arrays_only():
    from torch_tpu.runtime import host_copies

    def kept(t):
        return host_copies.host_copy(torch_tpu.to_jax(t.to("tpu"))) is not None

    assert kept(torch.tensor([1, 2])) and kept(torch.tensor([True, False]))
    assert not kept(torch.tensor([1.0, 2.0]))
    assert not kept(torch.zeros(host_copies.HOST_COPY_BYTES // 8 + 1, dtype=torch.int64))


def test_a_view_keeps_a_host_copy_only_inside_its_storage_copy():
    import jax.numpy as jnp
    import numpy as np

    from torch_tpu.runtime import host_copies

    geometry = torch.empty(5, dtype=torch.int64)[1:]  # (4,), stride 1, offset 1
    inside, past = jnp.zeros(4, jnp.int64), jnp.zeros(4, jnp.int64)
    host_copies.keep_view_of_host_copy(inside, np.arange(5), geometry)
    host_copies.keep_view_of_host_copy(past, np.arange(4), geometry)  # would read one past the end
    assert host_copies.host_copy(inside).tolist() == [1, 2, 3, 4]
    assert host_copies.host_copy(past) is None


def test_targets_equal_to_ignore_index_pass_the_bounds_check():
    logits = torch.randn(4, 3, device="tpu")
    targets = torch.tensor([0, -100, 2, -100])
    with torch_tpu.eager_mode("fused"):
        loss = F.cross_entropy(logits, targets.to("tpu"))
        torch.testing.assert_close(loss.cpu(), F.cross_entropy(logits.cpu(), targets))
        bad = F.cross_entropy(logits, torch.tensor([0, 3, 2, -100], device="tpu"))
        with pytest.raises(IndexError, match="Target 3 is out of bounds"):
            bad.item()


def test_a_failed_step_leaves_the_gradients_as_they_were():
    """The embedding's out-of-range index is reported at the end of backward(); as on CPU (where
    the forward raises), .grad keeps what it had before the step, so stepping on is harmless."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(5, 3), torch.nn.Linear(3, 1)).to("tpu")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with torch_tpu.eager_mode("fused"):
        model(torch.tensor([1, 2], device="tpu")).sum().backward()  # a good step: grads exist
        before = {name: p.grad.cpu().clone() for name, p in model.named_parameters()}
        with pytest.raises(IndexError, match="index out of range.*end of backward"):
            model(torch.tensor([1, 7], device="tpu")).sum().backward()
        for name, p in model.named_parameters():
            torch.testing.assert_close(p.grad.cpu(), before[name], rtol=0, atol=0, msg=name)
        optimizer.zero_grad(set_to_none=True)
        with pytest.raises(IndexError):
            model(torch.tensor([9], device="tpu")).sum().backward()
        assert all(p.grad is None for p in model.parameters())
        weights = [p.cpu().clone() for p in model.parameters()]
        optimizer.step()  # nothing to apply
        for p, w in zip(model.parameters(), weights):
            torch.testing.assert_close(p.cpu(), w, rtol=0, atol=0)


def test_compiled_program_checks_report_at_the_read():
    f = torch.compile(lambda w, i: F.embedding(i, w) * 2, backend="tpu")
    weight = torch.randn(5, 3, device="tpu")
    good = f(weight, torch.tensor([1, 2], device="tpu"))
    bad = f(weight, torch.tensor([1, 7], device="tpu"))
    assert good.sum().item() == pytest.approx((weight[1:3] * 2).sum().item())
    with pytest.raises(IndexError, match="index out of range"):
        bad.cpu()


def test_a_graph_with_a_check_is_freed_by_reference_counting():
    """A check's callback must not keep its graph alive through the values it reads: a graph
    left in a reference cycle would hold its device buffers until the cycle collector runs,
    and a training loop would pay for full collections of a growing heap."""
    x, w = torch.randn(512, 512, device="tpu"), torch.randn(512, 512, device="tpu")
    weight = torch.randn(512, 3, device="tpu")
    gc.collect()
    gc.disable()
    try:
        with torch_tpu.eager_mode("fused"):
            index = (x @ w).argmax(-1)  # computed in the graph: the check reads a deferred value
            looked_up = F.embedding(index, weight)
            graph = weakref.ref(context.recorder.graph)
            looked_up.cpu()
            torch.tpu.synchronize()
            del index, looked_up
            (weight * 2).cpu()  # a new graph: the recorder lets go of the old one
        assert graph() is None
    finally:
        gc.enable()
