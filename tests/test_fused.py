"""Fused eager: modes, deferral and sync points, views under deferral, the compilation cache,
errors, explanations and memory."""

from __future__ import annotations

import copy
import math

import jax
import pytest
import torch
import torch.nn.functional as F

import torch_tpu
from torch_tpu import execution
from torch_tpu.demo.model import GPT, GPTConfig
from torch_tpu.execution.fused import _KEYED_AS_IS, _typed
from torch_tpu.runtime.context import context
from torch_tpu.runtime.flags import flags
from torch_tpu.runtime.lru import Kind, caches


@pytest.fixture
def fused():
    with torch_tpu.eager_mode("fused"):
        yield
    assert execution.pending_ops() == 0


# ----------------------------------------------------------------------------- modes
def test_default_mode_is_strict_and_switching_is_scoped():
    assert torch_tpu.get_eager_mode() == torch_tpu.EagerMode.STRICT
    with torch_tpu.eager_mode("fused"):
        assert torch_tpu.get_eager_mode() == "fused"
        with torch_tpu.eager_mode("debug"):
            assert torch_tpu.get_eager_mode() == "debug"
        assert torch_tpu.get_eager_mode() == "fused"
    assert torch_tpu.get_eager_mode() == "strict"
    assert torch_tpu.EagerMode("fused") is torch_tpu.EagerMode.DEFER_AND_FUSE  # upstream name
    with pytest.raises(ValueError, match="unknown eager mode 'lazy'"):
        torch_tpu.set_eager_mode("lazy")


@pytest.mark.parametrize(
    "env, mode", [({"TORCH_TPU_DEFER_AND_FUSE": "1"}, "fused"), ({"TPU_LAUNCH_BLOCKING": "1"}, "debug")]
)
def test_environment_picks_the_starting_mode(run_python, env, mode):
    out = run_python(
        """
        import torch, torch_tpu
        x = torch.arange(4.0, device="tpu") * 3
        print(torch_tpu.get_eager_mode().value, x.sum().item())
    """,
        **env,
    )
    assert out.split() == [mode, "18.0"]


def test_switching_modes_runs_pending_work():
    with torch_tpu.eager_mode("fused"):
        x = torch.ones(4, device="tpu") * 5
        assert execution.pending_ops() > 0
    assert execution.pending_ops() == 0
    assert execution.last_sync_reason() == "sync"
    assert x.sum().item() == 20.0


# ----------------------------------------------------------------------------- deferral
SYNC_POINTS = {
    "item": lambda x: x.sum().item(),
    "cpu": lambda x: x.cpu(),
    "tolist": lambda x: x.tolist(),
    "repr": lambda x: repr(x),
    "nonzero": lambda x: x.nonzero(),
    "sync": lambda x: torch_tpu.sync(),
    "synchronize": lambda x: torch.tpu.synchronize(),
}


@pytest.mark.parametrize("name", sorted(SYNC_POINTS))
def test_sync_points_run_the_graph(fused, name):
    x = torch.arange(6.0, device="tpu").reshape(2, 3) * 2 - 1
    assert execution.pending_ops() > 0
    SYNC_POINTS[name](x)
    assert execution.pending_ops() == 0
    torch.testing.assert_close(x.cpu(), torch.arange(6.0).reshape(2, 3) * 2 - 1)


def test_backward_and_optimizer_step_end_their_graphs(fused):
    layer = torch.nn.Linear(4, 2).to("tpu")
    optimizer = torch.optim.SGD(layer.parameters(), lr=0.1)
    layer(torch.ones(3, 4, device="tpu")).sum().backward()
    assert execution.pending_ops() == 0 and execution.last_sync_reason() == "end of backward()"
    optimizer.step()
    assert execution.pending_ops() == 0
    assert execution.last_sync_reason() == "end of optimizer.step()"


def test_views_and_in_place_writes_stay_correct_while_deferred(fused):
    def program(device):
        base = torch.arange(12.0, device=device).reshape(3, 4)
        view = base[:, 1:3]  # a strided view of a deferred value
        view.mul_(10)  # writes through to base
        base.t()[0].add_(100)  # and through a transposed view
        alias = base.view(-1)[::5]
        alias.zero_()
        flat = base.flatten().clone()
        flat[2:4] = torch.tensor([-1.0, -2.0], device=device)
        as_int = base.view(torch.int32)  # reinterpreted bits of a deferred buffer
        return base, view, flat, as_int.bitwise_and(0xFFFF)

    for actual, expected in zip(program("tpu"), program("cpu")):
        torch.testing.assert_close(actual.cpu(), expected)


def test_graph_is_bounded_without_sync_points(fused, monkeypatch):
    monkeypatch.setattr(flags, "max_nodes", 50)
    x = torch.zeros(8, device="tpu")
    for _ in range(200):
        x = x + 1
        assert execution.pending_ops() <= 50
    assert x.sum().item() == 1600.0


def test_stablehlo_of_the_pending_graph(fused):
    x = torch.ones(3, device="tpu")
    y = torch.sin(x) * 2
    text = execution.pending_stablehlo()
    assert "stablehlo.sine" in text and "func.func" in text
    assert execution.pending_ops() > 0  # dumping does not run it
    assert y.sum().item() == pytest.approx(3 * 2 * 0.8414709848)


# ----------------------------------------------------------------------------- cache
def _train(model, steps, lr_schedule=None):
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    inputs = torch.randint(0, 16, (4, 8), generator=torch.Generator().manual_seed(0))
    inputs, targets = inputs.to("tpu"), inputs.roll(1, 1).to("tpu")
    losses = []
    for step in range(steps):
        if lr_schedule:
            for group in optimizer.param_groups:
                group["lr"] = lr_schedule(step)
        _, loss = model(inputs, targets=targets)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.detach())
    return [loss.item() for loss in losses]


def _tiny_gpt():
    torch.manual_seed(0)
    return GPT(GPTConfig(vocab_size=16, block_size=8, n_layer=1, n_head=2, n_embd=16))


def test_training_matches_strict_and_steady_state_compiles_nothing():
    model = _tiny_gpt()
    strict = _train(copy.deepcopy(model).to("tpu"), 4, lambda s: 1e-3 * (s + 1))
    with torch_tpu.eager_mode("fused"):
        fused_model = copy.deepcopy(model).to("tpu")
        _train(fused_model, 3, lambda s: 1e-3 * (s + 1))  # warm-up: first steps create state
        torch.tpu.reset_compilation_cache_stats()
        more = _train(fused_model, 3, lambda s: 1e-3 * (s + 10))  # a new lr every step
        stats = torch.tpu.compilation_cache_stats()
    assert stats["misses"] == 0 and stats["hits"] == stats["requests"] > 0, stats
    with torch_tpu.eager_mode("fused"):
        replay = _train(copy.deepcopy(model).to("tpu"), 4, lambda s: 1e-3 * (s + 1))
    torch.testing.assert_close(replay, strict, rtol=1e-5, atol=1e-6)
    assert len(more) == 3


def test_memory_does_not_grow_over_many_steps(fused):
    layer = torch.nn.Linear(8, 8).to("tpu")
    optimizer = torch.optim.SGD(layer.parameters(), lr=0.01)
    x = torch.randn(4, 8).to("tpu")

    def step():
        loss = layer(x).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()

    for _ in range(20):
        step()
    torch_tpu.sync()
    before = len(jax.live_arrays())
    for _ in range(1000):
        step()
    torch_tpu.sync()
    assert len(jax.live_arrays()) <= before
    assert execution.pending_ops() == 0


def test_buffers_that_die_in_a_graph_are_donated_and_others_are_not(fused):
    p = torch.randn(1000).to("tpu")
    torch_tpu.sync()
    torch.tpu.reset_compilation_cache_stats()
    p.add_(1)  # the old value of p dies inside this graph: XLA may update it in place
    torch_tpu.sync()
    assert torch.tpu.compilation_cache_stats()["donated_buffers"] == 1
    held = torch_tpu.to_jax(p)  # a reference from outside: must survive
    expected = p.cpu() * 2
    p.mul_(2)
    torch_tpu.sync()
    assert torch.tpu.compilation_cache_stats()["donated_buffers"] == 1
    assert not held.is_deleted()
    torch.testing.assert_close(p.cpu(), expected)


# ----------------------------------------------------------------------------- errors
def test_shape_errors_raise_at_the_op_and_lose_nothing(fused):
    a = torch.ones(2, 3, device="tpu") * 2
    with pytest.raises(
        RuntimeError, match=r"The size of tensor a \(3\) must match the size of tensor b \(4\)"
    ):  # as on CPU
        a + torch.ones(4, device="tpu")
    assert a.sum().item() == 12.0  # the pending graph survived the error


def test_out_of_range_index_reports_at_the_sync_point_naming_the_op(fused):
    weight = torch.randn(5, 3, device="tpu")
    looked_up = F.embedding(torch.tensor([1, 7], device="tpu"), weight)
    with pytest.raises(
        IndexError,
        match=r"index out of range in self \(raised by "
        r"aten\.embedding\.default at .*test_fused\.py:\d+",
    ):
        looked_up.sum().item()
    assert weight.shape == (5, 3) and torch.isfinite(weight).all().item()


def test_debug_mode_raises_at_the_users_line():
    with torch_tpu.eager_mode("debug"):
        weight = torch.randn(5, 3, device="tpu")
        with pytest.raises(IndexError, match="index out of range") as info:
            F.embedding(torch.tensor([9], device="tpu"), weight)
    assert any(
        entry.path.name == "test_fused.py" and "F.embedding" in str(entry.statement)
        for entry in info.traceback
    )


def test_recompiles_are_explained(run_python):
    _, err = run_python(
        """
        import sys, torch, torch_tpu
        torch_tpu.set_eager_mode("fused")
        for n in (4, 4, 5):
            x = torch.ones(n, device="tpu")
            (x * 2).sum().item()                 # the line to blame
    """,
        capture_stderr=True,
        TORCH_TPU_LOG_RECOMPILES="1",
    )
    assert "compiling a new graph" in err
    # ones(5) records another fill than ones(4), its size now dynamic and padded to its bucket
    # of 8 (docs/execution.md, "Shapes that change"): its static shape argument is named
    assert "recompiling" in err and "changed: (4,) -> (8,)" in err, err


def test_a_second_process_loads_compiled_graphs_from_disk(run_python, tmp_path):
    program = """
        import torch, torch_tpu
        torch_tpu.set_eager_mode("fused")
        x = torch.arange(8.0, device="tpu")
        print((x.sin() * 3 + x).sum().item(), torch.tpu.compilation_cache_stats()["disk_hits"])
    """
    cache = str(tmp_path / "xla-cache")
    first = run_python(program, TORCH_TPU_CACHE_DIR=cache).split()
    second = run_python(program, TORCH_TPU_CACHE_DIR=cache).split()
    assert first[0] == second[0]
    assert int(first[1]) == 0 and int(second[1]) > 0


# ----------------------------------------------------------------------------- churning ops
def _growing_loop(steps: int, device: str, sizes=None, start: int = 2):
    """A generation-like loop: a sequence grows by one step each iteration (its cat and read
    change shape), while the work on its last element keeps one shape."""
    torch.manual_seed(0)
    weight = torch.randn(8, 8).to(device)
    sequence = torch.zeros(1, start, 8).to(device)
    results = []
    for step in range(steps):
        last = sequence[:, -1]  # a read of a growing buffer
        hidden = torch.tanh(last @ weight) + step
        sequence = torch.cat([sequence, hidden[:, None]], dim=1)  # needs this graph's value
        if sizes is not None:
            sequence = sequence[:, -sizes[step] :]
        results.append(hidden.sum().item())  # a sync point each step, as generation has
    return results, sequence.cpu()


def test_ops_whose_shapes_grow_every_graph_run_alone_and_the_rest_stays_compiled(fresh_churn):
    expected = _growing_loop(12, "cpu")
    torch.tpu.reset_compilation_cache_stats()
    with torch_tpu.eager_mode("fused"):
        actual = _growing_loop(12, "tpu")
    stats = torch.tpu.compilation_cache_stats()
    torch.testing.assert_close(actual[0], expected[0])
    torch.testing.assert_close(actual[1], expected[1])
    assert stats["ops_run_alone"] > 0
    # once the growing ops run alone, the fixed-shape work hits the graph cache every step
    # (after a second pass, which compiles the first steps' graphs without the growing ops)
    with torch_tpu.eager_mode("fused"):
        _growing_loop(12, "tpu")
        before = torch.tpu.compilation_cache_stats()["misses"]
        assert _growing_loop(12, "tpu")[0] == actual[0]
        assert torch.tpu.compilation_cache_stats()["misses"] == before


def test_a_thread_whose_shapes_recur_keeps_every_op_in_its_graphs(fresh_churn):
    from torch_tpu.runtime.context import context

    expected = _growing_loop(12, "cpu")
    torch.tpu.reset_compilation_cache_stats()
    context.shapes_recur = True
    try:
        with torch_tpu.eager_mode("fused"):
            actual = _growing_loop(12, "tpu")
    finally:
        context.shapes_recur = False
    torch.testing.assert_close(actual[0], expected[0])
    assert torch.tpu.compilation_cache_stats()["ops_run_alone"] == 0


def test_recurring_shapes_are_not_taken_for_churn(fresh_churn):
    sizes = [4, 3] * 6  # lengths 3, 4, 3, 4...: each shape compiles once, then is cached
    expected = _growing_loop(12, "cpu", sizes, start=3)
    torch.tpu.reset_compilation_cache_stats()
    with torch_tpu.eager_mode("fused"):
        actual = _growing_loop(12, "tpu", sizes, start=3)
    torch.testing.assert_close(actual[0], expected[0])
    assert torch.tpu.compilation_cache_stats()["ops_run_alone"] == 0


def test_an_op_run_alone_keeps_the_checks_of_its_inputs(fresh_churn):
    weight = torch.randn(5, 4, device="tpu")
    with torch_tpu.eager_mode("fused"):
        sequence = torch.zeros(1, 4, device="tpu")
        for _ in range(6):  # the cat learns to run alone
            sequence = torch.cat([sequence, sequence[-1:] + 1])
            sequence.sum().item()
        assert torch.tpu.compilation_cache_stats()["ops_run_alone"] > 0
        bad = F.embedding(torch.tensor([9], device="tpu"), weight)  # a failing value check
        grown = torch.cat([sequence, bad])
        with pytest.raises(IndexError, match="index out of range"):
            grown.cpu()


def _mostly_fixed_loop(steps: int, device: str):
    """A decoding-like step: many ops keep their shapes, one sequence grows a token a step."""
    torch.manual_seed(0)
    weight = torch.randn(8, 8).to(device)
    state = torch.zeros(1, 8).to(device)
    sequence = torch.zeros(1, 2).to(device)
    results = []
    for _ in range(steps):
        for _ in range(6):  # the fixed-shape work: far more ops than the growing ones
            state = torch.tanh(state @ weight + 0.5)
        sequence = torch.cat([sequence, state[:, :1]], dim=1)
        results.append(state.sum().item())
    return torch.tensor(results), sequence.cpu()  # float32 sums: compared at float32's tolerance


def test_a_few_ops_growing_in_an_otherwise_unchanged_graph_run_alone_at_once(fresh_churn):
    expected = _mostly_fixed_loop(3, "cpu")
    torch.tpu.reset_compilation_cache_stats()
    with torch_tpu.eager_mode("fused"):
        torch.testing.assert_close(_mostly_fixed_loop(2, "tpu")[0], expected[0][:2])
        assert torch.tpu.compilation_cache_stats()["ops_run_alone"] == 0
        # one graph with a new shape at a single position was enough to take that op out
        actual = _mostly_fixed_loop(3, "tpu")
    assert torch.tpu.compilation_cache_stats()["ops_run_alone"] > 0
    torch.testing.assert_close(actual[0], expected[0])
    torch.testing.assert_close(actual[1], expected[1])


def test_a_new_batch_size_changing_every_op_is_compiled_not_taken_apart(fresh_churn):
    weight = torch.randn(8, 8, device="tpu")
    torch.tpu.reset_compilation_cache_stats()
    with torch_tpu.eager_mode("fused"):
        for batch in (4, 5, 6):  # every op of the step changes shape: a new graph, not churn
            x = torch.randn(batch, 8, device="tpu")
            for _ in range(4):
                x = torch.tanh(x @ weight)
            x.sum().item()
    assert torch.tpu.compilation_cache_stats()["ops_run_alone"] == 0


def test_each_layers_slice_of_one_buffer_is_not_taken_for_churn(fresh_churn):
    """vLLM keeps every layer's KV cache in one buffer: one layer's slice is read at offset 0,
    another's with a start offset, by the same op on the same line. Not shapes that change."""
    buffer = torch.randn(2, 8, 4, device="tpu")
    torch.tpu.reset_compilation_cache_stats()
    sums = []
    with torch_tpu.eager_mode("fused"):
        for _ in range(3):
            for layer in (0, 1):
                h = buffer[layer] * 2  # (the only op whose inputs differ between the layers)
                for _ in range(10):
                    h = h + 1
                sums.append(h.sum().item())
    assert torch.tpu.compilation_cache_stats()["ops_run_alone"] == 0
    want = [float((buffer[layer].cpu() * 2 + 10).sum()) for layer in (0, 1)] * 3
    torch.testing.assert_close(sums, want, rtol=1e-5, atol=1e-5)


def _step_of_kind(x, weight, kind: str):
    """Two loops' steps starting with the same op on the same line, then other ops, and later at
    one position the same op as each other with other inputs."""
    h = x @ weight
    h = torch.tanh(h) if kind == "train" else torch.sigmoid(h)
    for i in range(30):
        h = h + 1 if kind == "train" or i != 20 else h + h[:, :1]  # (the same add, other inputs)
    return h.sum().item()


def test_an_op_meeting_another_loops_shapes_after_its_ops_differ_is_not_taken_for_churn(fresh_churn):
    x, weight = torch.randn(4, 8), torch.randn(8, 8)
    kinds = ("train", "eval") * 3
    exact = [_step_of_kind(x.double(), weight.double(), kind) for kind in kinds]
    expected = [_step_of_kind(x, weight, kind) for kind in kinds]
    torch.tpu.reset_compilation_cache_stats()
    with torch_tpu.eager_mode("fused"):
        actual = [_step_of_kind(x.to("tpu"), weight.to("tpu"), kind) for kind in kinds]
    # float32 sums of positive terms (about 30 each), 30 additions then 32 terms summed in another
    # order than CPU's: within CPU's own distance from the float64 result, or that many roundings
    for got, cpu, reference in zip(actual, expected, exact):
        bound = max(4 * abs(cpu - reference), 64 * torch.finfo(torch.float32).eps * abs(reference))
        assert abs(got - reference) <= bound, (got, cpu, reference)
    stats = torch.tpu.compilation_cache_stats()
    assert stats["ops_run_alone"] == 0 and stats["misses"] == 2, stats


def test_a_graph_does_not_change_when_a_changing_number_meets_a_constant():
    x = torch.ones(4, device="tpu")
    misses = []
    with torch_tpu.eager_mode("fused"):
        for step in range(5, 1, -1):  # at step 3 the two numbers are one cached device scalar
            assert (x * 3 + step).sum().item() == 4 * (3 + step)
            misses.append(torch.tpu.compilation_cache_stats()["misses"])
    assert misses[1:] == misses[:1] * 3


def test_static_argument_keys_tell_apart_numbers_equal_in_python():
    """A node's static arguments are keyed by type and value: 1, 1.0 and True, 0.0 and -0.0 are
    equal in Python but make other programs; every NaN is one key (else each would miss)."""
    numbers = [1, 1.0, True, 0.0, -0.0, 2.5, (1, 2), (1.0, 2), [1, 2]]
    keys = [_typed(n) for n in numbers]
    assert len(set(keys)) == len(keys)
    assert _typed(math.nan) == _typed(float("-nan"))
    assert _typed((0.0, math.nan)) == _typed((0.0, math.nan)) != _typed((-0.0, math.nan))
    for plain in (3, False, "mean", None):  # the kinds Graph._specs keys without calling _typed
        assert type(plain) in _KEYED_AS_IS and _typed(plain) == (type(plain), plain)


@pytest.mark.parametrize(
    "change",
    [
        pytest.param(lambda x: x.double(), id="dtype"),
        pytest.param(lambda x: torch.cat([x, x]), id="shape"),
        pytest.param(lambda x: x.to(torch.bfloat16), id="narrower_dtype"),
    ],
)
def test_a_compiled_graph_is_reused_only_for_inputs_of_its_shapes_and_dtypes(fused, change):
    def graph(x):
        return (torch.sin(x) * 2 + x).sum(0)

    cpu = torch.randn(6, 3, dtype=torch.float32, generator=torch.Generator().manual_seed(0))
    first = cpu.to("tpu")
    torch.testing.assert_close(graph(first).cpu(), graph(cpu))
    torch.tpu.reset_compilation_cache_stats()
    same = (cpu + 1).to("tpu")  # another array of the same shape and dtype: the same program
    torch.testing.assert_close(graph(same).cpu(), graph(cpu + 1))
    assert torch.tpu.compilation_cache_stats()["misses"] == 0
    other = change(cpu)
    torch.testing.assert_close(graph(other.to("tpu")).cpu(), graph(other))
    assert torch.tpu.compilation_cache_stats()["misses"] == 1


def test_only_values_still_referenced_when_a_graph_runs_are_its_outputs(fused):
    cpu = torch.randn(4, generator=torch.Generator().manual_seed(0))
    x = cpu.to("tpu")
    kept = x * 2
    dropped = kept + 1
    result = dropped * 3
    del dropped  # (its value is still an input of the third op, inside the graph)
    live, _ = context.recorder.graph._live_outputs()
    assert sorted(d.node for d in live) == [0, 2]
    torch.testing.assert_close(result.cpu(), (cpu * 2 + 1) * 3)
    torch.testing.assert_close(kept.cpu(), cpu * 2)


# ----------------------------------------------------------------------------- repeated nodes
def _forward(model, x, scale):
    """Ops of every spec kind: scalars (a leaf per use), one tensor read twice, views at an
    offset, lists, static floats, tuple outputs, a check's taint."""
    h = model(x) * scale + x[:, 1:].sum(-1, keepdim=True)
    h = torch.cat([h, h.t()[:1].t()], dim=1) + (x + x)[:, :1]
    mean, std = torch.std_mean(h, dim=0)
    emb = F.embedding((h.detach() > 0).long().sum(1) % 3, model.weight.t())  # an index check
    return (h * std + mean).clamp(-2.5, 2.5).sum() + emb.sum()


def _graph_state(graph):
    outputs = [(d.node, d.index, d.shape, d.dtype, d.size, d.weak_type) for d in graph.outputs]
    return (
        list(graph.nodes),
        list(graph.leaf_avals),
        [sorted(c.origin for c in t) for t in graph.taints],
        list(graph.positions),
        list(graph.signatures),
        sorted(graph.leaf_ids.values()),
        outputs,
        graph.seen,
    )


@pytest.mark.skipif(not flags.record_in_core, reason="needs the C++ runtime core")
def test_the_core_records_a_repeated_node_as_graph_record_does(monkeypatch):
    """A node that repeats its template's is recorded by the C++ core: the graph it builds (node
    keys, leaves, checks each node depends on, outputs) is the one Graph.record builds, and a
    node that differs from the template (another static, dtype or shape) is not taken for it."""
    model = torch.nn.Linear(4, 3).to("tpu")
    cpu_x = torch.randn(5, 4, generator=torch.Generator().manual_seed(0))
    states, losses, by_core = {}, {}, []
    record_repeated = execution.fused._record_repeated

    def counted(graph, fn, args, matmul_precision):
        own_checks = len(graph._unclaimed)
        outputs = record_repeated(graph, fn, args, matmul_precision)
        if outputs is not NotImplemented:
            by_core.append((fn.__name__, own_checks, len(graph._unclaimed)))
        return outputs

    monkeypatch.setattr(execution.fused, "_record_repeated", counted)
    with torch_tpu.eager_mode("fused"):
        for in_core in (True, False, True, False):
            monkeypatch.setattr(flags, "record_in_core", in_core)
            for scale in (2.0, 3.0, -0.0):  # (a new number each step: another cached scalar)
                x = cpu_x.to("tpu")
                loss = _forward(model, x, scale)
                states.setdefault(in_core, []).append(_graph_state(context.recorder.graph))
                loss.backward()  # (its graph, recorded the same way, runs at its end)
                losses.setdefault(in_core, []).append(loss.item())
                model.zero_grad()
    assert states[True] == states[False]
    assert losses[True] == losses[False]
    assert any(t for t in states[True][-1][2]), "no node depended on a check"
    # the lookup, with its own bounds check (the graph's until a node claims it)
    assert ("embedding", 1, 0) in by_core
    # a node unlike its template's: another dim, dtype or shape; each result as CPU's
    with torch_tpu.eager_mode("fused"):
        changes = ((0, torch.float32, 5), (1, torch.float32, 5), (1, torch.float64, 5), (1, torch.float64, 2))
        for dim, dtype, rows in changes:
            cpu = cpu_x[:rows].to(dtype)
            x = cpu.to("tpu")
            torch.testing.assert_close(((x * 2).sum(dim) + 1).cpu(), (cpu * 2).sum(dim) + 1)


@pytest.mark.skipif(not flags.record_in_core, reason="needs the C++ runtime core")
def test_the_core_reads_a_view_for_a_fused_node_as_python_does(fused, monkeypatch):
    from torch_tpu.runtime import buffer, tensor

    base = torch.arange(24.0, device="tpu").reshape(4, 6)
    views = [base, base.t(), base[1:, 2:], base[:, :1], base[2], base.reshape(6, 4)[1:], base[::2, 1::3]]
    views += [base.view(torch.int32)[1:], torch.view_as_complex(base.reshape(4, 3, 2))[1:]]
    # the core reads all but the two of another dtype than their storage's value (Python reads
    # those, and keeps the storage's value in their dtype: the last ones, then)
    assert [type(tensor._read_recorded(v)) is buffer.StridedView for v in views] == [True] * 7 + [False] * 2
    for view in views:
        core = tensor.read_in_program(view)
        with monkeypatch.context() as patch:
            patch.setattr(tensor, "_read_recorded", lambda t: None)
            python = tensor.read_in_program(view)
        assert type(core) is type(python)
        if type(core) is buffer.StridedView:
            assert core.buf is python.buf and core.geometry == python.geometry
            assert (core.start is None) == (python.start is None)
            assert core.start is None or int(core.start) == int(python.start)
        else:
            assert core is python


def test_graphs_of_several_shapes_in_turn_each_follow_the_last_graph_of_theirs(monkeypatch):
    """A loop whose graphs start on one line but take turns in shape (batch shapes, sequence
    buckets) takes every node from the last graph of the same shape, not from the last graph,
    which differs at each node; results as CPU's."""
    # (three shapes in turn are the point: size buckets would make these rows one shape)
    monkeypatch.setattr(torch_tpu.config, "buckets", False)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.GELU(), torch.nn.Linear(8, 2))
    batches = [torch.randn(rows, 4, generator=torch.Generator().manual_seed(rows)) for rows in (3, 5, 7)]
    replica = copy.deepcopy(model).to("tpu")
    with torch_tpu.eager_mode("fused"):
        for step in range(9):
            out = replica(batches[step % 3].to("tpu")).sum(0)
            graph = context.recorder.graph
            if step >= 3:
                assert len(graph.entries) == len(graph.template)
                assert all(node is template for node, template in zip(graph.entries, graph.template))
            torch.testing.assert_close(out.cpu(), model(batches[step % 3]).sum(0))
    # a graph that followed one replaced it: one recent graph per shape stays kept
    assert len(execution.fused._templates.get(graph.start)) == 3


@pytest.mark.skipif(not flags.record_in_core, reason="needs the C++ runtime core")
def test_the_core_records_nodes_returning_lists_and_tuples_with_none(monkeypatch):
    """A foreach op's list of outputs, and a backward's tuple holding None for a gradient not
    asked for, repeated at their places: recorded by the core (Graph.record is not called for
    them after the first graph), with the structure and results Graph.record gives."""
    in_python = []
    record = execution.fused.Graph.record

    def counted(self, fn, args, kwargs, name, *rest):
        in_python.append(name)
        return record(self, fn, args, kwargs, name, *rest)

    monkeypatch.setattr(execution.fused.Graph, "record", counted)
    generator = torch.Generator().manual_seed(0)
    shapes = ((2, 3, 8), (4, 3, 3), (2, 4, 6))  # a 1-d convolution's input, weight, output gradient
    x, weight, grad = (torch.randn(*shape, generator=generator) for shape in shapes)

    def step(device: str) -> list:
        x_, weight_, grad_ = (t.to(device) + 0 for t in (x, weight, grad))  # (not a graph's first op)
        scaled = torch._foreach_mul([x_, weight_], 2.0)
        grads = torch.ops.aten.convolution_backward(
            grad_, x_, weight_, None, [1], [0], [1], False, [0], 1, [True, True, False]
        )
        return [*scaled, *grads]

    expected = step("cpu")
    with torch_tpu.eager_mode("fused"):
        for in_core in (True, False):
            monkeypatch.setattr(flags, "record_in_core", in_core)
            for _ in range(3):
                in_python.clear()
                got = step("tpu")
                assert [type(g) for g in got] == [type(e) for e in expected]  # (None where CPU's)
                for g, e in zip(got, expected):
                    if e is not None:
                        torch.testing.assert_close(g.cpu(), e)
            by_python = {"aten._foreach_mul.Scalar", "aten.convolution_backward.default"} & set(in_python)
            assert not by_python if in_core else by_python


@pytest.mark.skipif(not flags.record_in_core, reason="needs the C++ runtime core")
def test_the_core_refuses_node_entries_it_would_misread(monkeypatch):
    """The C++ core reads a template's NodeEntry by field position: ``configure_fused`` refuses
    an entry record whose fields are not the ones it reads, before it takes anything, and the
    core keeps recording repeated nodes."""
    from typing import NamedTuple

    from torch_tpu.runtime import buffer, checks, native

    fused = execution.fused
    fields = fused.NodeEntry._fields
    Reordered = NamedTuple("NodeEntry", [(name, object) for name in (*fields[1:], fields[0])])
    with pytest.raises(TypeError, match="NodeEntry's fields"):
        native._C.configure_fused(
            vars(fused), vars(checks), buffer.Deferred, buffer.StridedView, buffer.ARRAY_TYPE,
            jax.Array, Reordered,
        )  # fmt: skip
    in_python = []
    record = fused.Graph.record

    def counted(self, fn, args, kwargs, name, *rest):
        in_python.append(name)
        return record(self, fn, args, kwargs, name, *rest)

    monkeypatch.setattr(fused.Graph, "record", counted)
    x = torch.arange(12.0).reshape(3, 4)
    with torch_tpu.eager_mode("fused"):
        for _ in range(3):
            in_python.clear()
            y = ((x.to("tpu") + 1) * 2 - 3).sum(0)  # (every graph starts on this line)
            torch.testing.assert_close(y.cpu(), ((x + 1) * 2 - 3).sum(0))
    assert len(in_python) == 1  # the graph's first op: the rest repeat the template's, in the core


# ----------------------------------------------------------------------------- background compiles
@pytest.fixture
def in_background(fresh_churn):
    from torch_tpu.execution import background

    was = background._enabled
    background.set_enabled(True)
    caches.clear(Kind.PROGRAMS)  # (graphs of these shapes compiled by earlier tests)
    yield background
    background.wait()
    background.set_enabled(was)


def _mlp_loss_and_grad(model, x):
    model.zero_grad()
    loss = model(x).square().mean()
    loss.backward()
    return loss.item(), model[0].weight.grad.cpu()


def _mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 2))


def test_background_compiles_are_off_on_the_stand_in_by_default():
    from torch_tpu.execution import background

    if background._enabled is None:
        assert background.enabled() is (torch_tpu.runtime.platform.platform() == "tpu")


def test_a_graph_met_at_new_shapes_runs_op_by_op_while_its_program_compiles(in_background):
    cpu = _mlp()
    model = copy.deepcopy(cpu).to("tpu")
    batches = [torch.randn(n, 8, generator=torch.Generator().manual_seed(n)) for n in (4, 4, 12, 12)]
    seen = []
    with torch_tpu.eager_mode("fused"):
        for k, x in enumerate(batches):
            if k == 3:
                in_background.wait()  # (the program of batch 12 is ready now)
            before = torch.tpu.compilation_cache_stats()
            loss, grad = _mlp_loss_and_grad(model, x.to("tpu"))
            after = torch.tpu.compilation_cache_stats()
            seen.append(
                {key: after[key] - before[key] for key in ("background_compiles", "graphs_run_by_op")}
            )
            want_loss, want_grad = _mlp_loss_and_grad(cpu, x)
            torch.testing.assert_close(loss, want_loss, rtol=1e-5, atol=1e-6)
            torch.testing.assert_close(grad, want_grad, rtol=1e-5, atol=1e-6)
    assert (
        seen[0] == seen[1] == {"background_compiles": 0, "graphs_run_by_op": 0}
    )  # (a new graph: compiled now)
    assert (
        seen[2]["background_compiles"] > 0 and seen[2]["graphs_run_by_op"] == seen[2]["background_compiles"]
    )
    assert seen[3] == {"background_compiles": 0, "graphs_run_by_op": 0}, seen  # (it took the program)


def test_a_failed_background_compile_is_done_again_in_the_foreground(in_background, monkeypatch):
    def failing(lowered, options):
        raise RuntimeError("compile failed on the worker")

    monkeypatch.setattr(in_background, "_compile", failing)
    cpu, x = _mlp(), torch.randn(12, 8)
    model = copy.deepcopy(cpu).to("tpu")
    with torch_tpu.eager_mode("fused"):
        _mlp_loss_and_grad(model, torch.randn(4, 8, device="tpu"))
        _mlp_loss_and_grad(cpu, torch.randn(4, 8))  # (keeps both models' grads alike: zeroed)
        first = _mlp_loss_and_grad(model, x.to("tpu"))  # op by op; its compile fails on the worker
        in_background.wait()
        before = torch.tpu.compilation_cache_stats()
        again = _mlp_loss_and_grad(model, x.to("tpu"))  # compiled now, in the foreground
        after = torch.tpu.compilation_cache_stats()
    assert after["graphs_run_by_op"] == before["graphs_run_by_op"]
    want = _mlp_loss_and_grad(cpu, x)
    for got in (first, again):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_forgetting_compiled_graphs_forgets_those_compiling(in_background):

    model = _mlp().to("tpu")
    with torch_tpu.eager_mode("fused"):
        _mlp_loss_and_grad(model, torch.randn(4, 8).to("tpu"))
        _mlp_loss_and_grad(model, torch.randn(12, 8).to("tpu"))
        assert in_background._pending
        caches.clear(Kind.PROGRAMS)
        assert not in_background._pending
