"""What the eager hot path caches is never reused where it does not apply: random keys drawn a
block at a time, device constants keyed by value, factory programs keyed by shape and dtype,
promotion keyed by the operands' dtypes and the default dtype."""

from __future__ import annotations

import math
import re

import pytest
import torch
import torch.nn.functional as F

import torch_tpu
from torch_tpu import execution
from torch_tpu.runtime.transfer import HOST_FILLS
from torch_tpu.testing.ops_seen import OpsSeen
from torch_tpu.testing.reference import assert_matches_cpu


def _draws(n: int) -> list[torch.Tensor]:
    return [torch.rand(3, device="tpu").cpu() for _ in range(n)]


def test_random_values_do_not_depend_on_where_key_blocks_start():
    torch.manual_seed(7)
    straight = _draws(150)  # crosses block boundaries
    torch.manual_seed(7)
    _draws(10)
    state = torch.tpu.get_rng_state()
    resumed = _draws(140)
    torch.tpu.set_rng_state(state)  # mid-block: the next keys are the same ones again
    assert all(torch.equal(a, b) for a, b in zip(straight[10:], resumed))
    assert all(torch.equal(a, b) for a, b in zip(resumed, _draws(140)))


def test_reseeding_forgets_the_keys_drawn_ahead():
    torch.manual_seed(1)
    first = _draws(3)
    torch.manual_seed(2)
    other = _draws(3)
    torch.manual_seed(1)
    assert all(torch.equal(a, b) for a, b in zip(first, _draws(3)))
    assert not any(torch.equal(a, b) for a, b in zip(first, other))


def test_fused_and_strict_draw_the_same_keys():
    torch.manual_seed(3)
    strict = torch.randn(64, device="tpu").cpu()
    torch.manual_seed(3)
    with torch_tpu.eager_mode("fused"):
        fused = torch.randn(64, device="tpu").cpu()
    assert torch.equal(strict, fused)


@pytest.mark.parametrize(
    "value, dtype",
    [
        (2.5, torch.float32),
        (-0.0, torch.float32),
        (0.0, torch.float32),
        (1, torch.float32),
        (True, torch.float32),
        (7, torch.int8),
        (-1, torch.int64),
        (2**63 - 1, torch.int64),
        (2**64 - 1, torch.uint64),
        (1e-3, torch.bfloat16),
        (1 + 2j, torch.complex64),
        (math.inf, torch.float16),
        (True, torch.bool),
    ],
)
def test_fills_take_each_value_and_dtype_in_turn(value, dtype):
    """One program per shape and dtype serves every fill value (a runtime input): values equal in
    Python (1, 1.0, True; 0.0 and -0.0) must still fill their own bits, whether the fill is
    built on the host (its first few times) or by that program."""
    for shape in ((3,), (2, 2)):
        expected = torch.full(shape, value, dtype=dtype)
        for _ in range(HOST_FILLS + 1):
            actual = torch.full(shape, value, dtype=dtype, device="tpu").cpu()
            assert actual.dtype == expected.dtype
            assert torch.equal(actual.view(torch.uint8), expected.view(torch.uint8)), (value, dtype)


def test_zeros_ones_and_integer_ranges_follow_shape_and_default_dtype():
    before = torch.get_default_dtype()
    try:
        for default in (torch.float32, torch.float64):
            torch.set_default_dtype(default)
            for make in (torch.zeros, torch.ones):
                for shape in ((2,), (3, 1)):
                    actual = make(*shape, device="tpu")
                    assert actual.dtype == default and torch.equal(actual.cpu(), make(*shape))
    finally:
        torch.set_default_dtype(before)
    for end in (5, 6, 5):
        assert torch.equal(torch.arange(end, device="tpu").cpu(), torch.arange(end))
    assert torch.equal(torch.arange(2, 9, 3, device="tpu").cpu(), torch.arange(2, 9, 3))


@pytest.mark.parametrize("mode", ["strict", "fused"])
def test_a_range_worked_out_once_follows_its_arguments_their_types_and_dtype(mode):
    # (ends, dtype): the same ints again, ints given as floats or bools, -0.0 after 0.0
    calls = [((5,), None), ((0, 5, 2), None), ((5,), torch.int32), ((0.0, 3.0), None), ((-0.0, 3.0), None)]
    calls += [((5,), None), ((True, 4), None), ((5.0,), None)]
    before = torch.get_default_dtype()
    try:
        with torch_tpu.eager_mode(mode):
            for default in (torch.float32, torch.float64, torch.float32):
                torch.set_default_dtype(default)
                for ends, dtype in calls:
                    expected = torch.arange(*ends, dtype=dtype)
                    actual = torch.arange(*ends, dtype=dtype, device="tpu").cpu()
                    assert actual.dtype == expected.dtype and torch.equal(actual, expected), ends
                    assert torch.equal(torch.signbit(actual), torch.signbit(expected)), ends
                    if not actual.is_floating_point():  # its host copy, which bounds checks read
                        source = torch.arange(10.0)
                        on_tpu = torch.arange(*ends, dtype=dtype, device="tpu")
                        assert torch.equal(source.to("tpu")[on_tpu].cpu(), source[expected])
                        with pytest.raises(IndexError):
                            source[:3].to("tpu")[on_tpu].cpu()
    finally:
        torch.set_default_dtype(before)


def test_promotion_is_not_reused_across_dtypes_dimensions_or_default_dtype():
    cases = [
        (torch.ones(2, dtype=torch.int32), torch.ones(2, dtype=torch.int64)),
        (torch.ones(2, dtype=torch.int32), torch.ones((), dtype=torch.int64)),
        (torch.ones(2, dtype=torch.float16), torch.ones((), dtype=torch.float64)),
        (torch.ones((), dtype=torch.float16), torch.ones((), dtype=torch.float64)),
    ]
    before = torch.get_default_dtype()
    try:
        for default in (torch.float32, torch.float64):
            torch.set_default_dtype(default)
            for a, b in cases:
                for other in (b, 2.5, 3):
                    on_tpu = other.to("tpu") if isinstance(other, torch.Tensor) else other
                    assert (a.to("tpu") + on_tpu).dtype == (a + other).dtype
                    assert (a.to("tpu") / on_tpu).dtype == (a / other).dtype
    finally:
        torch.set_default_dtype(before)


def _outcome(call) -> str:
    try:
        call()
        return "ok"
    except Exception as error:  # noqa: BLE001  (the outcome is compared)
        return type(error).__name__


@pytest.mark.parametrize(
    "calls",
    [
        # a dtype CPU's kernel lacks (uint32 add): refused at every call, whatever ran before
        [
            lambda d: torch.ones(2, dtype=torch.int32, device=d) + torch.ones(2, dtype=torch.int32, device=d),
            lambda d: (
                torch.ones(2, dtype=torch.uint32, device=d) + torch.ones(2, dtype=torch.uint32, device=d)
            ),
            lambda d: (
                torch.ones(2, dtype=torch.uint32, device=d) + torch.ones(2, dtype=torch.uint32, device=d)
            ),
            lambda d: torch.ones(2, dtype=torch.int32, device=d) + torch.ones(2, dtype=torch.int32, device=d),
        ],
        # a dtype CPU's kernel table refuses (gelu of integers), checked once per promotion
        [
            lambda d, dtype=dtype: torch.nn.functional.gelu(torch.ones(2, dtype=dtype, device=d))
            for dtype in (torch.float32, torch.int64, torch.float32, torch.int64, torch.bool)
        ],
        # a refusal that depends on the arguments, not only their dtypes (bool clamp with both
        # bounds; with one it runs)
        [
            lambda d, bounds=bounds: torch.clamp(*[torch.ones(2, dtype=torch.bool, device=d)] * bounds)
            for bounds in (2, 3, 2)
        ],
    ],
    ids=["dtypes", "table", "arguments"],
)
def test_a_cached_promotion_keeps_refusing_what_cpu_refuses(calls):
    """The dtype check is cached with the promotion only where it depends on the dtypes alone."""
    for _ in range(2):
        assert [_outcome(lambda: c("tpu").cpu()) for c in calls] == [
            _outcome(lambda: c("cpu")) for c in calls
        ]


def _executables_built() -> int:
    stats = torch.tpu.compilation_cache_stats()
    return stats["xla_compiles"] + stats["disk_hits"]


_FILLS = {
    "zeros": lambda source: torch.zeros(source.shape, dtype=source.dtype, device=source.device),
    "ones": lambda source: torch.ones(source.shape, dtype=source.dtype, device=source.device),
    "full": lambda source: torch.full(source.shape, 1, dtype=source.dtype, device=source.device),
    "zeros_like": torch.zeros_like,
    "new_ones": lambda source: source.new_ones(source.shape),
    "fill_": lambda source: torch.empty_like(source).fill_(1),
    "zero_": lambda source: torch.nn.init.zeros_(torch.empty_like(source)),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64, torch.bool], ids=str)
@pytest.mark.parametrize("name", _FILLS)
def test_a_fill_compiles_only_once_it_recurs(name, dtype):
    """Strict eager builds a fill's first few instances on the host (no program to compile for
    a one-off); one made more often than that compiles, and both give CPU's values."""
    shape = (3, 1, 7 + list(_FILLS).index(name), 5)  # (a shape no other test fills)
    source = torch.full(shape, 2).to(dtype)
    make = _FILLS[name]
    expected = make(source)
    source = source.to("tpu")
    built = _executables_built()
    first = [make(source) for _ in range(HOST_FILLS)]
    assert _executables_built() == built
    later = [make(source) for _ in range(2)]
    assert _executables_built() > built
    for made in first + later:
        assert made.dtype == dtype and made.device == source.device
        assert torch.equal(made.cpu(), expected)


@pytest.mark.parametrize("make", [torch.zeros, torch.ones, lambda n, **kw: torch.arange(n, **kw).float()])
def test_a_factory_result_and_a_copied_tensor_share_executables(make):
    # JAX compiles a program per placement of its arguments: a factory's value left
    # uncommitted would compile every op reading it a second time
    copied = torch.full((7, 3), 2.0).to("tpu")
    (copied * 3 + 1).cpu()
    made = make(21, device="tpu").reshape(7, 3) if make is not torch.zeros else make(7, 3, device="tpu")
    made.cpu()
    before = _executables_built()
    result = made * 3 + 1
    assert _executables_built() == before
    torch.testing.assert_close(result.cpu(), made.cpu() * 3 + 1)


@pytest.mark.parametrize("mode", ["strict", "fused"])
def test_a_kept_integer_range_is_one_per_range_dtype_and_device_and_never_written(mode):
    """Small integer ranges are copied to the device once and shared by every tensor made from
    them (no program, no graph node): each range, dtype and device has its own value, an
    in-place update of one tensor leaves the others and later ranges as they were, and a range
    used as indices is bounds-checked all the same."""
    calls = [
        lambda d: torch.arange(64, device=d),
        lambda d: torch.arange(64, device=d, dtype=torch.int32),
        lambda d: torch.arange(1, 65, device=d),
        lambda d: torch.arange(0, 128, 2, device=d),
        lambda d: torch.arange(64.0, device=d, dtype=torch.int64),
        lambda d: torch.arange(64, 0, -1, device=d, dtype=torch.int16),
    ]
    with torch_tpu.eager_mode(mode):
        before = execution.pending_ops()
        made = [make("tpu") for make in calls]
        if mode == "fused":
            assert execution.pending_ops() == before  # (copied values: nothing to compute)
        first = made[0]
        first.add_(1)  # (a new value for its storage; the kept one stays)
        again = calls[0]("tpu")
        for tensor, make in zip([*made[1:], again], [*calls[1:], calls[0]]):
            expected = make("cpu")
            assert tensor.dtype == expected.dtype and tensor.device.type == "tpu"
            assert torch.equal(tensor.cpu(), expected)
        assert torch.equal(first.cpu(), torch.arange(64) + 1)
        table = torch.zeros(63, 2, device="tpu")
        with pytest.raises(IndexError, match="out of range"):
            torch.nn.functional.embedding(calls[0]("tpu"), table).cpu()


@pytest.mark.parametrize("mode", ["strict", "fused"])
def test_a_view_of_a_host_copy_is_bounds_checked_by_its_own_elements(mode):
    """Views read from indices copied from the host keep their part of the host copy, for
    bounds checks without the device: a slice is checked by its own elements, whichever view
    was checked first, and a flattened view (kept with the whole) by all of them."""
    table = torch.randn(8, 2)
    with torch_tpu.eager_mode(mode):
        ids = torch.tensor([[0, 3], [5, 9]]).to("tpu")  # (9: out of range, in the last row only)
        for view, bad in [
            (lambda: ids[0], False),
            (lambda: ids.view(-1), True),
            (lambda: ids[1], True),
        ] * 2 + [(lambda: ids.view(-1)[:3], False)]:
            if bad:
                with pytest.raises(IndexError, match="index out of range"):
                    F.embedding(view(), table.to("tpu")).cpu()
            else:
                out = F.embedding(view(), table.to("tpu"))
                assert torch.equal(out.cpu(), F.embedding(view().cpu(), table))
        fine = torch.tensor([[0, 3], [5, 7]]).to("tpu")
        for _ in range(2):
            out = F.cross_entropy(torch.randn(4, 8).to("tpu"), fine.view(-1))
            assert out.cpu().isfinite()
        with pytest.raises(IndexError, match="out of bounds"):
            F.cross_entropy(torch.randn(4, 8).to("tpu"), ids.view(-1)).cpu()


@pytest.mark.parametrize("mode", ["strict", "fused"])
def test_a_reshape_of_host_indices_is_kept_with_their_value_and_never_stale(mode):
    """A flattened view of indices copied from the host (a loss's targets, read every step) is
    read once and kept with their array (no program, no node again); a new value of the
    storage (an in-place update) or a view of another shape reads its own."""
    from torch_tpu.runtime import tensor

    logits = torch.randn(4, 9)

    def expected_loss(targets):
        return [F.cross_entropy(logits.to(dtype), targets) for dtype in (torch.float32, torch.float64)]

    with torch_tpu.eager_mode(mode):
        ids = torch.tensor([[0, 3], [5, 7]]).to("tpu")
        flat = tensor.read(ids.view(-1))
        before = execution.pending_ops()
        assert tensor.read(ids.reshape(-1)) is flat
        assert execution.pending_ops() == before
        assert tensor.read(ids.view(4, 1)) is not flat
        for _ in range(2):
            loss = F.cross_entropy(logits.to("tpu"), ids.view(-1))
            assert_matches_cpu(loss, *expected_loss(torch.tensor([0, 3, 5, 7])))
        ids.add_(1)
        assert torch.equal(ids.view(-1).cpu(), torch.tensor([1, 4, 6, 8]))
        assert torch.equal(ids.view(4, 1).cpu(), torch.tensor([[1], [4], [6], [8]]))
        loss = F.cross_entropy(logits.to("tpu"), ids.view(-1))
        assert_matches_cpu(loss, *expected_loss(torch.tensor([1, 4, 6, 8])))


def _outcome_of(call):
    """What a call did: its value on the host, or its error's type and message."""
    try:
        return call().cpu()
    except RuntimeError as error:
        return (type(error), str(error).split("\n")[0])


@pytest.mark.parametrize("mode", ["strict", "fused"])
def test_an_in_place_plan_serves_only_a_whole_unaliased_first_argument_of_its_shape(mode):
    """An in-place call (``add_``) served from its plan writes its program's output into its
    first argument; a later call with the same key whose first argument is a view, shares its
    storage with another argument, has another shape than the output (broadcast) or takes a
    gradient must still do what CPU does, and every call bumps the version counter."""
    torch.manual_seed(0)
    host = {name: torch.randn(16) for name in "abc"}
    host["column"], host["square"] = torch.randn(4, 1), torch.randn(4, 4)
    with torch_tpu.eager_mode(mode):
        for device in ("cpu", "tpu"):
            t = {name: value.clone().to(device) for name, value in host.items()}
            results = []
            for _ in range(3):  # (the first calls learn the plan, the later ones take it)
                version = t["a"]._version
                t["a"].add_(t["b"])
                assert t["a"]._version == version + 1
            results.append(t["a"].clone())
            base = t["c"].clone()
            view = base[4:12]
            view.add_(t["b"][:8])  # (a view: only its elements change)
            results.append(base)
            same = t["a"].view(16)  # (its whole storage again: full overlap, 2a as on CPU)
            t["a"].add_(same)
            results.append(t["a"].clone())
            results.append(_outcome_of(lambda: t["column"].add_(t["square"])))
            results.append(t["column"].clone())  # (untouched by the refused call)
            weight = host["b"].clone().to(device).requires_grad_()
            through = weight * 1.0
            through.add_(t["c"])
            through.sum().backward()
            results.append(weight.grad)
            results.append(through.detach())
            if device == "cpu":
                expected = results
        for got, want in zip(results, expected):
            if isinstance(want, tuple):
                assert got == want
            else:
                torch.testing.assert_close(got.cpu(), want, rtol=0, atol=0)


def _signs(t: torch.Tensor) -> list:
    """Each element's sign bit, None for a NaN (whose sign no op promises)."""
    return [None if v != v else b for v, b in zip(t.flatten().tolist(), torch.signbit(t).flatten().tolist())]


@pytest.mark.parametrize("mode", ["strict", "fused"])
def test_a_float_static_argument_never_reuses_the_program_of_one_equal_in_python(mode):
    """JAX's jit cache keys static arguments by ``==`` and hash: a call with ``-0.0`` must not
    run the program traced for ``0.0`` (the sign would be lost), and NaN, unequal to itself,
    must not build a new one at every call. Whole tensors (the C++ core's plans) and views
    (Python's fast path) both."""
    source = torch.tensor([[math.nan, 1.5], [-2.0, math.nan]])
    on_tpu = source.to("tpu")
    with torch_tpu.eager_mode(mode):
        for operand, expected_of in ((on_tpu, source), (on_tpu.t(), source.t())):
            for nan_as in (0.0, -0.0, 0.0, -0.0):
                got = torch.nan_to_num(operand, nan=nan_as, posinf=1.0).cpu()
                assert _signs(got) == _signs(torch.nan_to_num(expected_of, nan=nan_as, posinf=1.0))
            torch.nan_to_num(operand, nan=float("nan")).cpu()
            built = _executables_built()
            for _ in range(3):  # (a new NaN object each time, as ``float("nan")`` makes)
                torch.nan_to_num(operand, nan=float("nan")).cpu()
            assert _executables_built() == built


# ----------------------------------------------------------------------------- appends
def _grow(device: str, steps: int, dtype=torch.int64):
    ids = torch.arange(5).reshape(1, 5).to(dtype).to(device)
    base = ids
    for step in range(steps):
        ids = torch.cat([ids, torch.full((1, 1), step % 2 + 7, dtype=dtype, device=device)], dim=-1)
    return base, ids


@pytest.mark.parametrize("dtype", [torch.int64, torch.float32, torch.bool, torch.bfloat16])
def test_a_sequence_growing_by_cat_equals_cpu(dtype):
    base, ids = _grow("tpu", 70, dtype)  # past one capacity (64 elements) into the next
    cpu_base, cpu_ids = _grow("cpu", 70, dtype)
    assert ids.stride() == cpu_ids.stride() and ids.is_contiguous()
    assert torch.equal(ids.cpu(), cpu_ids) and torch.equal(base.cpu(), cpu_base)
    assert torch.equal(ids[:, -1:].cpu(), cpu_ids[:, -1:])
    assert torch.equal(ids[:, 3:9].cpu(), cpu_ids[:, 3:9])


def test_appends_to_one_sequence_are_independent():
    _, ids = _grow("tpu", 3)
    left = torch.cat([ids, torch.tensor([[100]], device="tpu")], dim=1)
    right = torch.cat([ids, torch.tensor([[200, 201]], device="tpu")], dim=1)
    left[0, 0] = -1  # a write to one result reaches neither the other nor the sequence
    assert left.cpu().tolist() == [[-1, 1, 2, 3, 4, 7, 8, 7, 100]]
    assert right.cpu().tolist() == [[0, 1, 2, 3, 4, 7, 8, 7, 200, 201]]
    assert ids.cpu().tolist() == [[0, 1, 2, 3, 4, 7, 8, 7]]
    rows = torch.cat([torch.ones(40, 3, device="tpu"), torch.zeros(2, 3, device="tpu")])  # along dim 0
    assert torch.equal(rows.cpu(), torch.cat([torch.ones(40, 3), torch.zeros(2, 3)]))


@pytest.mark.parametrize("start", [9, 3])  # (3: a short prompt, one token longer each step)
def test_a_growing_sequence_reuses_its_executables_until_it_outgrows_its_room(start):
    ids = torch.zeros(1, start, dtype=torch.int64, device="tpu")
    for _ in range(3):
        ids = torch.cat([ids, ids[:, -1:] + 1], dim=-1)
    before = _executables_built()
    for _ in range(40):  # 40 lengths: one storage shape, and the last token one view of it
        ids = torch.cat([ids, ids[:, -1:] + 1], dim=-1)
    assert _executables_built() == before
    assert ids.cpu().tolist() == [[0] * start + list(range(1, 44))]


def _views(base: torch.Tensor) -> list[torch.Tensor]:
    """Views of one (4, 6) storage of one op's program: the whole, transposed, offset slices, a
    strided (non-dense) one, an expanded one, a size-1 dim."""
    return [
        base[:, :4],
        base.t()[:4],
        base[1:, 2:6],
        base[::2, 1::2],
        base[1, 2:6].expand(3, 4),
        base[3:4, 1:5].expand(3, 4),
    ]


@pytest.mark.parametrize("mode", ["strict", "fused"])
def test_views_read_inside_programs_are_keyed_by_their_geometry(mode):
    """A view reaches its op's program as the storage's array and its geometry: every geometry
    and start gets its own right answer from the same op, strict or recorded (one node each)."""
    base_cpu = torch.arange(24.0).reshape(4, 6)
    base = base_cpu.to("tpu")
    other = torch.full((3, 4), 0.5)
    with torch_tpu.eager_mode(mode):
        for view, expected in zip(_views(base), _views(base_cpu)):
            shape = expected.shape
            rows = min(shape[0], 3)
            got = view[:rows] * other[:rows, : shape[1]].to("tpu")
            torch.testing.assert_close(got.cpu(), expected[:rows] * other[:rows, : shape[1]])


def test_a_graph_recorded_again_takes_a_node_from_its_template_only_where_it_is_the_same(monkeypatch):
    """A graph that starts where the last one started compares each node with the node at its
    place there (or in another recent graph of that start) and takes it only where it is the
    same op on the same signature; any other shape, dtype or view geometry looks the node up
    (and gives CPU's values)."""
    from torch_tpu.execution import fused

    def step(x):
        return (x * 2).sum(0) + x[0]

    lookups, nodes = [], fused._nodes

    class Looked:  # (fused._nodes, its lookups counted)
        def get(self, key, default=None):
            lookups.append(key)
            return nodes.get(key, default)

        def __setitem__(self, key, value):
            nodes[key] = value

    monkeypatch.setattr(fused, "_nodes", Looked())
    # (the shapes below change on purpose, to show what a template gives for each; size buckets
    # would pad the later ones and change their graphs: test_buckets.py covers those)
    monkeypatch.setattr(torch_tpu.config, "buckets", False)
    inputs = [
        torch.ones(3, 4),
        torch.arange(12.0).reshape(3, 4),  # the same graph again: no lookup
        torch.arange(12.0).reshape(4, 3),  # another shape
        torch.arange(12, dtype=torch.int32).reshape(3, 4),  # another dtype
        torch.arange(12.0).reshape(4, 3).t(),  # a view
        torch.ones(3, 4),  # the first shape again: its last graph is one of the recent ones
    ]
    for x in inputs:
        lookups.clear()
        with torch_tpu.eager_mode("fused"):
            got = step(x.to("tpu"))  # (every graph starts on this line)
        expected = step(x)
        assert got.dtype == expected.dtype
        torch.testing.assert_close(got.cpu(), expected, rtol=0, atol=0)
        if x is inputs[1] or x is inputs[-1]:
            assert not lookups
        elif x is not inputs[0]:
            assert lookups  # (what changed was looked up, not taken from the template)


def test_a_view_adds_no_node_to_a_fused_graph():
    x, w = torch.randn(5, 4, device="tpu"), torch.randn(3, 4, device="tpu")
    torch_tpu.sync()
    with torch_tpu.eager_mode("fused"):
        y = torch.nn.functional.linear(x, w) + w[1:2, :3]  # w.t() and a slice: views
        assert torch_tpu.execution.pending_ops() == 2  # the matmul and the add
    torch.testing.assert_close(y.cpu(), torch.nn.functional.linear(x.cpu(), w.cpu()) + w.cpu()[1:2, :3])


# ----------------------------------------------------------------------------- the fast path
# A call with positional arguments only reuses the program of the first call with the same key
# (per argument a tensor's dtype, whether it is 0-dim and its whole storage, or another value's
# type; the default dtype), converting only its views, numbers and static arguments. Each case
# below runs its calls twice (the second time they take the kept programs), calls with keys that
# must not take each other's, or with one key and values the kept program must not fix.


def _twice_as_on_cpu(make_calls, mode: str) -> None:
    """Each call's result has CPU's dtype, shape and strides and its values (to CPU's kernels'
    rounding), the same the second time, when the calls take kept programs, as the first."""
    cpu = [call("cpu") for call in make_calls]
    rounds = []
    for _ in range(2):
        with torch_tpu.eager_mode(mode):
            tpu = [call("tpu") for call in make_calls]
        for got, expected in zip(tpu, cpu):
            assert got.dtype == expected.dtype and got.shape == expected.shape
            assert got.stride() == expected.stride()
            torch.testing.assert_close(got.cpu(), expected)
        rounds.append([t.cpu() for t in tpu])
    for first, second in zip(*rounds):
        torch.testing.assert_close(second, first, rtol=0, atol=0)


def _on(device, values, dtype=None) -> torch.Tensor:
    return torch.as_tensor(values, dtype=dtype).to(device)


_F16, _F64 = torch.float16, torch.float64


@pytest.mark.parametrize(
    "make_calls",
    [
        # other dtypes after a kept float32 program
        [
            lambda d: _on(d, [0.0, 1.5, 2.0]) + _on(d, [1.0, 1.0, 1.0]),
            lambda d: _on(d, [0.0, 1.5, 2.0], _F64) + _on(d, [1.0, 1.0, 1.0], _F64),
            lambda d: _on(d, [0, 1, 2]) + _on(d, [1, 1, 1], torch.int32),
        ],
        # the same dtypes, 0-dim or not: promotion differs
        [
            lambda d: _on(d, [1.0, 2.0, 3.0], _F16) * _on(d, 2.5, _F64),
            lambda d: _on(d, 1.5, _F16) * _on(d, 2.5, _F64),
            lambda d: _on(d, [1.0, 2.0, 3.0], _F64) * _on(d, 1.5, _F16),
        ],
        # numbers: their types promote, their values are runtime inputs (a default's is not)
        [
            lambda d: _on(d, [1, 2, 3]) * 2,
            lambda d: _on(d, [1, 2, 3]) * 3,
            lambda d: _on(d, [1, 2, 3]) * 2.5,
            lambda d: _on(d, [1, 2, 3]) * True,
            lambda d: _on(d, [1.0, 2.0], _F16) * 1e5,
            lambda d: torch.nn.functional.leaky_relu(_on(d, [-1.0, 2.0]), 0.2),
            lambda d: torch.nn.functional.leaky_relu(_on(d, [-1.0, 2.0]), 0.01),
            lambda d: torch.nn.functional.leaky_relu(_on(d, [-1.0, 2.0]), 0.5),
        ],
        # another shape, and views (transposed, offset, broadcast) of the kept dtypes: one key
        # for the three views, each read by its own geometry
        [
            lambda d: torch.arange(6.0).reshape(2, 3).to(d) - torch.ones(2, 3).to(d),
            lambda d: torch.arange(12.0).reshape(3, 4).to(d) - torch.ones(3, 4).to(d),
            lambda d: torch.arange(12.0).reshape(3, 4).to(d).t() - torch.ones(4, 3).to(d),
            lambda d: torch.arange(12.0).reshape(3, 4).to(d)[1:] - torch.ones(2, 4).to(d),
            lambda d: torch.arange(4.0).to(d).expand(3, 4) - torch.ones(3, 4).to(d),
        ],
        # whole storages with axes permuted (their values, read by the op's program), other
        # views of the same dtypes and dims (read by Python), whole tensors: three keys each
        [
            lambda d: torch.arange(12.0).reshape(3, 4).to(d).t() @ torch.ones(3, 2).to(d),
            lambda d: torch.arange(20.0).reshape(5, 4).to(d)[1:].t() @ torch.ones(4, 2).to(d),
            lambda d: torch.arange(12.0).reshape(4, 3).to(d) @ torch.ones(3, 2).to(d),
            lambda d: torch.arange(24.0).reshape(2, 3, 4).to(d).permute(2, 0, 1) * 2,
            lambda d: torch.arange(24.0).reshape(2, 3, 4).to(d).transpose(0, 2) * 2,
            lambda d: torch.arange(24.0).reshape(2, 3, 4).to(d)[:, 1:].transpose(0, 2) * 2,
            lambda d: torch.arange(6.0).reshape(1, 2, 3).to(d).transpose(1, 2) + 1,
            lambda d: torch.nn.functional.linear(
                torch.ones(2, 4).to(d), torch.arange(12.0).reshape(3, 4).to(d), torch.ones(3).to(d)
            ),
            # (an op whose check reads its operands' values takes views as Python reads them)
            lambda d: torch.gather(
                torch.arange(12.0).reshape(3, 4).to(d).t(), 0, torch.tensor([[0, 2, 1]]).to(d)
            ),
        ],
        # static arguments: one key, other values (a dim, a shape list, an approximation)
        [
            lambda d: torch.softmax(torch.arange(6.0).reshape(2, 3).to(d), 0),
            lambda d: torch.softmax(torch.arange(6.0).reshape(2, 3).to(d), 1),
            lambda d: torch.nn.functional.layer_norm(torch.arange(6.0).reshape(2, 3).to(d), [3]),
            lambda d: torch.nn.functional.layer_norm(torch.arange(6.0).reshape(2, 3).to(d), [2, 3]),
            lambda d: torch.nn.functional.gelu(torch.arange(-2.0, 2.0).to(d)),
            lambda d: torch.nn.functional.gelu(torch.arange(-2.0, 2.0).to(d), approximate="tanh"),
        ],
        # reductions, in-place and out= variants
        [
            lambda d: torch.softmax(_on(d, [[1.0, 2.0], [0.5, -1.0]]), -1),
            lambda d: torch.softmax(_on(d, [[1.0, 2.0], [0.5, -1.0]]), 0),
            lambda d: _on(d, [[1, 2], [3, 4]]).sum(),
            lambda d: _on(d, [0.0, 1.0, 2.0]).add_(_on(d, [1.0, 1.0, 1.0])),
            lambda d: torch.mul(_on(d, [0.0, 1.0]), _on(d, [2.0, 3.0]), out=_on(d, [0.0, 0.0])),
        ],
    ],
    ids=["dtypes", "0-dim", "numbers", "shapes-and-views", "permuted", "statics", "variants"],
)
@pytest.mark.parametrize("mode", ["strict", "fused"])
def test_a_kept_program_is_taken_only_by_calls_of_its_operand_key(make_calls, mode):
    _twice_as_on_cpu(make_calls, mode)


def _tensors_and_views() -> list[torch.Tensor]:
    base = torch.arange(24.0, device="tpu").reshape(2, 3, 4)
    column = torch.arange(4.0, device="tpu").reshape(4, 1)
    return [
        base,
        base.permute(2, 0, 1),
        base.transpose(1, 2),
        base.transpose(0, 1)[1:],
        base[:, :2].transpose(1, 2),
        base[1].t(),
        base.reshape(6, 4).t(),
        column.t(),
        column.expand(4, 3).t(),
        torch.arange(6.0, device="tpu").reshape(1, 2, 3).transpose(1, 2),
        torch.arange(6, device="tpu").reshape(2, 3).view(torch.float32).t(),
        torch.tensor([[1 + 2j, 3j], [4.0, 5j]], device="tpu").t(),
        torch.tensor([[1 + 2j, 3j], [4.0, 5j]], device="tpu").t().conj(),
        torch.tensor(3.0, device="tpu"),
    ]


def test_the_cores_reading_of_a_permuted_storage_is_pythons():
    """What ``whole_operands`` hands a program for a tensor at a position reading views in its
    program is what the general path's ``read_in_program`` hands it (a whole storage with axes
    permuted: the same StridedView), else the tensor itself, left for Python to read; and a
    permuted tensor at a position without that bit is left too. (The core may leave any tensor
    to Python, which reads every one.)"""
    from torch_tpu.runtime import buffer, tensor

    permuted = 0
    for t in _tensors_and_views():
        key, (operand,) = tensor.whole_operands((t,), 1)
        assert tensor.whole_operands((t,), 0)[1][0] is t or tensor.whole_value(t) is not None
        if operand is t:  # (Python reads it: a view, a reinterpreted or conjugated storage)
            continue
        if tensor.whole_value(t) is not None:
            assert operand is tensor.whole_value(t)
            continue
        read = tensor.read_in_program(t)
        assert type(operand) is type(read) is buffer.StridedView
        assert operand.buf is read.buf and operand.start is read.start is None
        assert (operand.shape, operand.strides) == (read.shape, read.strides)
        permuted += 1
    assert permuted == 5


def test_a_kept_program_follows_the_default_dtype():
    before = torch.get_default_dtype()
    a, b = torch.arange(1, 5, dtype=torch.int32), torch.full((4,), 3, dtype=torch.int32)
    try:
        for default in (torch.float32, torch.float64, torch.float32):
            torch.set_default_dtype(default)
            for _ in range(2):  # integers divide into the default dtype
                got = torch.true_divide(a.to("tpu"), b.to("tpu"))
                assert got.dtype == default
                torch.testing.assert_close(got.cpu(), torch.true_divide(a, b), rtol=0, atol=0)
    finally:
        torch.set_default_dtype(before)


def test_a_kept_program_is_recorded_in_fused_mode_and_runs_under_the_matmul_precision(monkeypatch):
    from torch_tpu.runtime import precision

    x, w = torch.randn(4, 8, device="tpu"), torch.randn(4, 8, device="tpu")
    for _ in range(2):
        expected = (x * w).cpu()
    torch_tpu.sync()
    with torch_tpu.eager_mode("fused"):
        y = x * w
        assert torch_tpu.execution.pending_ops() == 1  # recorded, not run at once
    torch.testing.assert_close(y.cpu(), expected, rtol=0, atol=0)

    calls = []
    real_call = precision.call
    monkeypatch.setattr(precision, "call", lambda fn, *a, **k: calls.append(fn) or real_call(fn, *a, **k))
    before = torch.get_float32_matmul_precision()
    try:
        torch.set_float32_matmul_precision("high")
        for _ in range(2):
            x * w
    finally:
        torch.set_float32_matmul_precision(before)
    assert len(calls) == 2  # each ran under the setting's precision


@pytest.mark.parametrize("mode", ["strict", "fused"])
def test_an_error_in_a_call_of_a_kept_program_is_the_general_paths(mode):
    """The kept program keys no shapes: a mismatch reaches it, and the error raised is the one
    the general path raises for the same shapes (from views: a key with no kept program)."""
    with torch_tpu.eager_mode(mode):
        for _ in range(2):
            (torch.ones(3, device="tpu") + torch.ones(3, device="tpu")).cpu()
        with pytest.raises(RuntimeError) as general:
            torch.ones(5, device="tpu")[1:4] + torch.ones(6, device="tpu")[2:]
        with pytest.raises(RuntimeError) as fast:
            torch.ones(3, device="tpu") + torch.ones(4, device="tpu")
        assert str(fast.value) == str(general.value) and "4" in str(fast.value)
        assert (torch.ones(3, device="tpu") + 1).sum().item() == 6.0  # the process goes on


# ----------------------------------------------------------------------------- plans the core serves
# A planned call (every argument a tensor the core reads whole, positional) runs from the C++
# core's PlannedKernel with no Python frame (in fused mode: none but the recorder's); every state
# the Python kernel handles differently sends the call back to it, and what it then does is what
# it does without a plan.
def _python_frames(call, under: str = "torch_tpu") -> list[str]:
    """The Python functions ``call`` ran from files whose path contains ``under``."""
    import sys

    frames = []

    def profile(frame, event, _arg):
        if event == "call" and under in frame.f_code.co_filename:
            frames.append(frame.f_code.co_name)

    sys.setprofile(profile)
    try:
        call()
    finally:
        sys.setprofile(None)
    return frames


@pytest.fixture
def planned():
    """Two tpu operands whose ``torch.add`` has a plan (run twice: learned, then served)."""
    from torch_tpu.runtime import native

    if not native.available():
        pytest.skip("the C++ runtime core is not built")
    a, b = torch.arange(4.0, device="tpu"), torch.full((4,), 0.5, device="tpu")
    for _ in range(2):
        torch.add(a, b)
    return a, b


@pytest.mark.parametrize("record", ["NativePlan", "NativeRule", "HostRule"])
def test_the_core_refuses_plan_records_it_would_misread(planned, record):
    """The C++ core reads the plan records by field position: ``configure_plans`` refuses records
    whose fields are not the ones it reads (a record changed on one side only), before it takes
    anything, and the plans already kept keep serving."""
    from torch_tpu.ops.dispatch import plans, registration

    fields = plans.field_names()
    fields[record] = (*fields[record][1:], fields[record][0])  # (the same names, another order)
    configured = registration._configure_core
    with pytest.raises(RuntimeError, match=f"reads {record} with other fields"):
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(plans, "field_names", lambda: fields)
            configured()
    a, b = planned
    assert not _python_frames(lambda: torch.add(a, b), "torch_tpu/ops/")


def test_a_planned_call_runs_no_python(planned):
    a, b = planned
    assert not _python_frames(lambda: torch.add(a, b))
    assert _python_frames(lambda: torch.add(a[1:], b[1:]))  # (views: Python reads them)
    assert _python_frames(lambda: torch.add(a, b, alpha=2))  # (a number to convert)
    torch.testing.assert_close(torch.add(a, b).cpu(), torch.arange(4.0) + 0.5, rtol=0, atol=0)


def test_a_planned_integer_sum_runs_its_host_rule_only_over_host_copies(planned):
    """``add`` has a host rule (``Lowering.host``): the core serves its integer calls, running
    the rule (Python) after the program only where an operand has a host copy, whose result
    becomes the output's."""
    from torch_tpu.runtime import tensor

    on_host = torch.tensor([3, 5]).to("tpu")  # (copied from the host: it has a host copy)
    computed = (on_host + 0.5).long()  # (from floats: it has none)
    for _ in range(2):
        on_host + on_host, computed + computed
    assert not _python_frames(lambda: computed + computed)
    frames = _python_frames(lambda: on_host + on_host)
    assert "shadow" in frames and "kernel" not in frames  # (the rule, not the Python kernel)
    assert tensor.host_value(on_host + on_host).tolist() == [6, 10]
    assert tensor.host_value(computed + computed) is None


@pytest.mark.parametrize("mode", ["strict", "fused"])
def test_a_planned_checked_call_runs_its_check_at_every_call(planned, mode):
    """An op with a value check (``Lowering.check``: ``index_select``'s bounds) is served by the
    core, which calls the check before the program at every call: a bad index of the planned
    key raises the general path's error, host-copied or computed on the device, and the
    process goes on."""
    weight = torch.arange(12.0).view(4, 3)
    on_tpu = weight.to("tpu")
    rows = torch.tensor([3, 0]).to("tpu")  # (copied from the host: checked on its host copy)
    with torch_tpu.eager_mode(mode):
        for _ in range(2):
            on_tpu.index_select(0, rows)
        frames = _python_frames(lambda: on_tpu.index_select(0, rows))
        assert "check" in frames and "kernel" not in frames and not {"_bind", "_planned_values"} & set(frames)
        past_end = [torch.tensor([1, 4]).to("tpu"), (torch.tensor([1.0, 4.0]).to("tpu") + 0.5).long()]
        for bad in past_end:  # (the same key as the planned calls')
            with pytest.raises(IndexError, match="index out of range in self"):
                on_tpu.index_select(0, bad).cpu()
        torch.testing.assert_close(on_tpu.index_select(0, rows).cpu(), weight[[3, 0]], rtol=0, atol=0)
    torch.tpu.synchronize()


def _index_lists(on: str) -> list[list]:
    """Lists of indices for a (4, 3) tensor, all of one key (the list is one argument): integer
    tensors of two dtypes, a None, a mask, a view, an index on the host, two indices."""
    rows = torch.tensor([3, 0, 3]).to(on)
    return [
        [rows],
        [None, torch.tensor([2, 0], dtype=torch.int32).to(on)],
        [torch.tensor([True, False, True, False]).to(on)],
        [rows[1:]],
        [torch.tensor([1, -1])],  # (on the host, as CUDA allows)
        [rows[:2], torch.tensor([0, 2]).to(on)],
    ]


@pytest.mark.parametrize("mode", ["strict", "fused"])
def test_an_index_plan_takes_lists_of_any_indices_and_equals_cpu(planned, mode):
    """``index`` (an eager lowering: it decides per call whether an index is a mask) is served
    by the core from one plan whatever its list of indices holds; each read, and each store
    (``x[indices] = v``, with ``accumulate``), equals CPU's. A store whose index shares the
    target's storage is left to Python, which refuses it as CPU does."""
    x = torch.arange(12.0).view(4, 3)
    on_tpu = x.to("tpu")
    with torch_tpu.eager_mode(mode):
        row = torch.tensor([1]).to("tpu")
        for _ in range(2):
            on_tpu[row]
        frames = _python_frames(lambda: on_tpu[row])
        assert "index" in frames and "kernel" not in frames and not {"_bind", "_planned_values"} & set(frames)
        for indices, on_host in zip(_index_lists("tpu"), _index_lists("cpu")):
            got = torch.ops.aten.index.Tensor(on_tpu, indices)
            torch.testing.assert_close(got.cpu(), torch.ops.aten.index.Tensor(x, on_host), rtol=0, atol=0)
            for accumulate in (False, True):
                target, expected = on_tpu.clone(), x.clone()
                for _ in range(2):
                    torch.ops.aten.index_put_(target, indices, torch.tensor(0.5).to("tpu"), accumulate)
                    torch.ops.aten.index_put_(expected, on_host, torch.tensor(0.5), accumulate)
                torch.testing.assert_close(target.cpu(), expected, rtol=0, atol=0)
        with pytest.raises(IndexError, match="index 4 is out of bounds for dimension 0 with size 4"):
            on_tpu[torch.tensor([4]).to("tpu")].cpu()
        ints, seven = torch.tensor([2, 0, 1, 3]).to("tpu"), torch.tensor(7).to("tpu")
        for _ in range(2):  # (the plan of the key learned from a store that does not overlap)
            torch.zeros(4, dtype=torch.int64, device="tpu").index_put_([ints], seven)
        with pytest.raises(RuntimeError, match="refer to a single memory location"):
            ints.index_put_([ints], seven)
        assert ints.tolist() == [2, 0, 1, 3]
    torch.tpu.synchronize()


#: what a planned call may still run in Python: a number's conversion to a device scalar (one
#: checked as well: ``dispatch.FittedNumber``), a view's StridedView (its constructor)
_CONVERSION_FRAMES = {"_number", "device_scalar", "get", "__init__", "__call__"}


def _served(call) -> bool:
    """Whether the core served ``call``: no Python ran but a number's conversion, or, while
    this thread records a fused graph, no op kernel's (its recorder's record is Python)."""
    from torch_tpu.runtime.context import context

    if context.recorder is not None:
        return set(_python_frames(call, "torch_tpu/ops/")) <= {"_number", "__call__"}
    return set(_python_frames(call)) <= _CONVERSION_FRAMES


@pytest.mark.parametrize(
    "calls",
    [
        # static arguments: other values of one key (a dims list, a dim, keepdim)
        [lambda x: x.sum([0]), lambda x: x.sum([1]), lambda x: x.sum([0, 1], True), lambda x: x.softmax(-1)],
        # numbers: their values are the program's inputs; a default's is its constant
        [
            lambda x: x * 2,
            lambda x: x * 3,
            lambda x: torch.nn.functional.leaky_relu(x, 0.01),
            lambda x: torch.nn.functional.leaky_relu(x, 0.3),
            lambda x: x.add(x, alpha=2),  # a keyword-only number
            lambda x: x.add(x, alpha=3),
            lambda x: x.add(x, alpha=1),  # (its default: the call's key is x.add(x)'s)
        ],
        # tuples of tensors; an optional tensor left None
        [
            lambda x: torch.max(x, 1),
            lambda x: torch.max(x, 0),
            lambda x: torch.nn.functional.layer_norm(x, [4]),
            lambda x: torch.nn.functional.layer_norm(x, [3, 4]),
        ],
    ],
    ids=["statics", "numbers", "tuples"],
)
@pytest.mark.parametrize("mode", ["strict", "fused"])
def test_the_core_converts_a_planned_calls_arguments_as_python_does(planned, calls, mode):
    """Each call the second time is served (no Python but a number's conversion; fused: recorded
    from the core) and equals what it gave the first time, through the Python kernel, and CPU's
    result."""
    x = torch.arange(12.0).reshape(3, 4) - 5
    on_tpu = x.to("tpu")
    for call in calls:
        expected = call(x)
        with torch_tpu.eager_mode(mode):
            first = call(on_tpu)
            assert _served(lambda: call(on_tpu))
            pending = torch_tpu.execution.pending_ops()
            second = call(on_tpu)
            assert torch_tpu.execution.pending_ops() == (pending + 1 if mode == "fused" else 0)
        for got, was, cpu in zip(*(torch.utils._pytree.tree_leaves(r) for r in (second, first, expected))):
            assert got.dtype == cpu.dtype and got.shape == cpu.shape and got.stride() == cpu.stride()
            torch.testing.assert_close(got.cpu(), was.cpu(), rtol=0, atol=0)
            torch.testing.assert_close(got.cpu(), cpu)


@pytest.mark.parametrize(
    "view, served_strict",
    [
        # a whole storage reshaped (strict eager reads it apart once and keeps it in that shape)
        (lambda x: x.reshape(4, 3), True),
        (lambda x: x[1:], False),  # at an offset
        (lambda x: x[:, 1:2], False),  # a size-1 dim's stride, at an offset
        (lambda x: x.t(), True),  # a whole storage permuted: read in the program in both modes
        (lambda x: (x * 2)[1:], False),  # a view of a value the graph still computes
    ],
    ids=["reshaped", "offset", "size-1", "permuted", "pending"],
)
def test_a_recorded_call_reads_its_views_in_the_core(planned, view, served_strict):
    """While a fused graph records, every view an op's program reads comes from the core as
    Python hands it (``tensor.read_in_program``): served, one node, and CPU's values and layout;
    strict eager keeps reading slices apart in Python."""
    x = torch.arange(12.0).reshape(3, 4) - 5
    on_tpu = x.to("tpu")
    expected = torch.exp(view(x)) + view(x)
    for mode in ("fused", "strict"):
        with torch_tpu.eager_mode(mode):
            results = [torch.exp(view(on_tpu)) + view(on_tpu)]  # (the first call keeps the plan)
            v = view(on_tpu)
            v.sum([0])  # (a plan kept; its output is contiguous: no Python wrap for a layout)
            assert _served(lambda: v.sum([0])) == (mode == "fused" or served_strict)
            pending = torch_tpu.execution.pending_ops()
            results.append(torch.exp(v) + v)
            if mode == "fused" and expected.is_contiguous():  # (else each output is stored transposed)
                assert torch_tpu.execution.pending_ops() == pending + 2  # (exp and add: no read of its own)
        for got in results:  # (the Python kernel's and the core's: the same program)
            assert got.stride() == expected.stride()
            torch.testing.assert_close(got.cpu(), results[0].cpu(), rtol=0, atol=0)
            torch.testing.assert_close(got.cpu(), expected)


def test_a_view_the_core_does_not_read_is_pythons(planned):
    """A view of the same key the core leaves to Python: a CPU tensor's (PyTorch's device
    error), a complex one (read resolved)."""
    a = torch.arange(12.0, device="tpu").reshape(3, 4)
    with torch_tpu.eager_mode("fused"):
        for _ in range(2):
            torch.add(a[1:], a[:2])
        with pytest.raises(RuntimeError, match="same device"):
            torch.add(a[1:], torch.ones(3, 4)[1:])
        z = torch.arange(6.0).reshape(3, 2).to(torch.complex64)
        on_tpu = z.to("tpu")
        for _ in range(2):
            got = torch.add(on_tpu[1:], on_tpu[:2])
        torch.testing.assert_close(got.cpu(), z[1:] + z[:2], rtol=0, atol=0)
        assert torch.add(a[1:], a[:2]).sum().item() == 88.0  # the process goes on


def test_a_planned_call_leaves_every_other_state_to_the_python_kernel(planned, monkeypatch):
    from torch_tpu.ops import dispatch
    from torch_tpu.runtime.context import context
    from torch_tpu.runtime.flags import flags

    a, b = planned
    expected = torch.arange(4.0) + 0.5

    def served_by_python():
        frames = _python_frames(lambda: torch.add(a, b))
        torch.testing.assert_close(torch.add(a, b).cpu(), expected, rtol=0, atol=0)
        return bool(frames)

    with monkeypatch.context() as m:
        m.setattr(context, "launch_blocking", True)
        assert served_by_python()
    with monkeypatch.context() as m:
        m.setattr(flags, "check_meta", True)
        assert served_by_python()
    with monkeypatch.context() as m:
        m.setattr(flags, "attention_needed", True)
        assert served_by_python()
    before = torch.get_float32_matmul_precision()
    try:
        torch.set_float32_matmul_precision("high")
        assert served_by_python()
    finally:
        torch.set_float32_matmul_precision(before)
    before = dispatch.recorded_ops
    try:
        seen = dispatch.record_ops()
        assert not _python_frames(lambda: torch.add(a, b))  # (served, and recorded as reached)
        assert seen == {torch.ops.aten.add.Tensor}
    finally:
        dispatch.recording.restore(before)
    with torch_tpu.eager_mode("fused"):
        assert not _python_frames(lambda: torch.add(a, b), "torch_tpu/ops/")  # (recorded from the core)
        y = torch.add(a, b)
        assert torch_tpu.execution.pending_ops() == 2  # recorded, not run
    torch.testing.assert_close(y.cpu(), expected, rtol=0, atol=0)
    assert not served_by_python()  # (and served again once every state is back)


def test_a_plan_serves_one_thread_while_another_records(planned):
    import threading

    a, b = planned
    pending, errors = [], []

    def fused_thread():
        try:
            with torch_tpu.eager_mode("fused"):
                y = torch.add(a, b)
                pending.append(torch_tpu.execution.pending_ops())
                pending.append(y.cpu())
        except Exception as error:  # noqa: BLE001  (raised again in the test's thread)
            errors.append(error)

    thread = threading.Thread(target=fused_thread)
    thread.start()
    thread.join()
    if errors:
        raise errors[0]
    assert pending[0] == 1
    assert not _python_frames(lambda: torch.add(a, b))
    torch.testing.assert_close(pending[1], torch.arange(4.0) + 0.5, rtol=0, atol=0)


# The dispatcher calls an op's PlannedKernel itself (no Python kernel holder around it). The core
# keys a call by its arguments up to the last one not at its default, a keyword-only one too; the
# Python kernel is passed them as the holder would: trailing and keyword-only arguments left out
# where they equal their defaults, other keyword-only ones by name.
def _registered_where(op: str) -> str:
    (line,) = (line for line in torch._C._dispatch_dump(op).splitlines() if line.startswith("PrivateUse1:"))
    return line


def test_the_dispatcher_calls_the_core_for_a_planned_op(planned):
    assert "BoxedPlannedKernel.cpp" in _registered_where("aten::add.Tensor")
    # (an op with a dtype argument is not converted by the core: Python's holder converts it)
    assert "BoxedPlannedKernel.cpp" not in _registered_where("aten::sum.dim_IntList")


@pytest.mark.parametrize(
    "call, served",
    [
        (lambda x, y: torch.add(x, y, alpha=1), True),  # a keyword argument equal to its default
        (lambda x, y: torch.add(x, y, alpha=2), True),  # ... another: a number of the call
        (lambda x, y: torch.add(x, y, alpha=0.5), True),
        (lambda x, y: torch.sub(x, y, alpha=-0.5), True),
        (lambda x, y: torch.nn.functional.gelu(x, approximate="tanh"), True),  # a keyword-only static
        (lambda x, y: torch.addcmul(x, x, y, value=0.3), True),
        (lambda x, y: torch.softmax(x + y, -1), True),
        (lambda x, y: torch.max(x - y, 0, False), True),  # a trailing default given
        (lambda x, y: torch.max(x - y, 0, True), True),
        (lambda x, y: torch.max(x - y, 0, keepdim=True), True),
    ],
)
def test_the_core_passes_the_dispatchers_arguments_as_pythons_holder_does(planned, call, served):
    x = torch.arange(12.0).reshape(3, 4) - 5
    y = torch.full((3, 4), 0.25)
    on_tpu = x.to("tpu"), y.to("tpu")
    expected = call(x, y)
    call(*on_tpu)
    if served:
        assert _served(lambda: call(*on_tpu))
    for got, cpu in zip(*(torch.utils._pytree.tree_leaves(r) for r in (call(*on_tpu), expected))):
        assert got.dtype == cpu.dtype and got.shape == cpu.shape and got.stride() == cpu.stride()
        torch.testing.assert_close(got.cpu(), cpu)


def test_an_in_place_call_with_a_keyword_argument_is_served_and_equals_cpu(planned):
    """``p.add_(g, alpha=-lr)`` (an optimizer's step) keeps the functional op's plan."""
    p, g = torch.arange(6.0), torch.full((6,), 0.25)
    on_tpu = p.to("tpu"), g.to("tpu")
    for _ in range(2):
        p.add_(g, alpha=-0.5)
        on_tpu[0].add_(on_tpu[1], alpha=-0.5)
    frames = _python_frames(lambda: on_tpu[0].add_(on_tpu[1], alpha=-0.5))
    assert set(frames) <= _CONVERSION_FRAMES | {"write_whole", "put"}, frames  # (the store is Python's)
    p.add_(g, alpha=-0.5)
    torch.testing.assert_close(on_tpu[0].cpu(), p, rtol=0, atol=0)


@pytest.mark.parametrize(
    "call, served",
    [
        (lambda x: x * 2, True),
        (lambda x: x * 2.5, True),
        (lambda x: x * True, True),
        (lambda x: (x > 0) * True, True),  # (bool times bool stays bool: the number's type counts)
        (lambda x: x.view(torch.int32) * -3, True),
        (lambda x: x * 1j, False),  # (a complex one: toPyObject's, then Python's)
    ],
    ids=["int", "float", "bool", "bool-tensor", "int-tensor", "complex"],
)
def test_a_number_pytorch_wraps_reaches_the_core_as_the_holder_passes_it(planned, call, served):
    """``x * 2`` hands the op a CPU tensor wrapping the number; the core passes the number itself,
    of its Python type, as PyTorch's kernel holder does, and the result equals CPU's."""
    x = torch.arange(6.0) - 2
    on_tpu = x.to("tpu")
    expected = call(x)
    for _ in range(2):
        call(on_tpu)
    if served:
        assert _served(lambda: call(on_tpu))
    got = call(on_tpu)
    assert got.dtype == expected.dtype
    torch.testing.assert_close(got.cpu(), expected, rtol=0, atol=0)


def test_the_ops_seen_helper_does_what_its_docstring_says():
    import doctest

    from torch_tpu.testing import ops_seen

    result = doctest.testmod(ops_seen)
    assert result.attempted > 0 and result.failed == 0


def test_a_dispatch_mode_sees_the_calls_the_core_serves(planned):
    a, b = planned
    with OpsSeen() as seen:
        y = torch.add(a, b)
    assert seen.ops == [torch.ops.aten.add.Tensor]
    torch.testing.assert_close(y.cpu(), torch.arange(4.0) + 0.5, rtol=0, atol=0)


def test_an_error_raised_under_the_core_is_pytorchs_and_loses_nothing(planned):
    a, b = planned
    with pytest.raises(RuntimeError, match=r"size of tensor a \(4\) must match the size of tensor b \(3\)"):
        torch.add(a, b[:3].clone())
    with pytest.raises(IndexError, match="Dimension out of range"):
        torch.softmax(a, 3)
    torch.testing.assert_close(torch.add(a, b).cpu(), torch.arange(4.0) + 0.5, rtol=0, atol=0)


def _same_number(a, b) -> bool:
    """Equal with the same type, -0.0 apart from 0.0 and NaN equal to NaN."""
    if type(a) is not type(b):
        return False
    if isinstance(a, float):
        return (a != a and b != b) or (a == b and math.copysign(1, a) == math.copysign(1, b))
    return a == b


def test_a_device_scalars_number_read_by_its_id_is_the_one_it_holds(monkeypatch):
    """Checks read a converted Scalar's number by the device scalar's id instead of from the
    device (``transfer.number_of``): it must be the number the array holds, for every kind of
    number, and never another array's once the list is emptied and ids are reused."""
    import jax.numpy as jnp

    from torch_tpu.ops._helpers import host_number
    from torch_tpu.runtime import devices, transfer

    monkeypatch.setattr(transfer, "_NUMBERS_HELD", 4)
    monkeypatch.setattr(transfer, "_numbers_by_id", {})
    devices.local.first.scalars.clear()  # (each number's scalar made, and listed, anew)
    numbers = [0.5, -0.0, 0.0, float("nan"), float("-inf"), 2**63 + 5, -3, True, False, 1e39, 7, 0.25]
    for number in numbers:  # (the list empties itself several times over)
        scalar = transfer.device_scalar(number)
        assert _same_number(host_number(scalar), number), number
        assert len(transfer._numbers_by_id) <= 4
    for number in numbers:  # (cached, most no longer listed: read from the device, the same)
        read = host_number(transfer.device_scalar(number))
        if read is None:  # (as before: an unlisted bool scalar cannot be told from a tensor's)
            assert type(number) is bool
        else:
            assert _same_number(read, number), number
    assert transfer.number_of(jnp.asarray(0.5)) is None  # (not one device_scalar made)
    assert transfer.number_of(0.5) is None


def test_a_device_scalar_is_typed_as_jax_takes_the_python_number(monkeypatch):
    """Put over directly (no ``jnp.asarray`` then ``device_put``), a device scalar is still
    what JAX makes of the Python number: weakly typed int64, float64, complex128, uint64 past
    int64, a strongly typed bool; committed to its device, concrete even inside a trace."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    from torch_tpu.runtime import devices, transfer

    devices.local.first.scalars.clear()
    for number in (3, -(2**63), 2**63 + 5, 0.5, -0.0, float("nan"), 1 + 2j, True):
        scalar = transfer.device_scalar(number)
        if type(number) is int and number >= 2**63:
            reference = jnp.asarray(np.uint64(number))
            assert scalar.weak_type
        else:
            reference = jnp.asarray(number)
            assert scalar.weak_type == reference.weak_type, number
        assert scalar.dtype == reference.dtype and scalar.committed, number
        assert repr(complex(scalar)) == repr(complex(np.asarray(reference)))
    traced = jax.jit(lambda x: x + transfer.device_scalar(41))
    assert int(traced(jnp.int32(1))) == 42


@pytest.mark.parametrize("mode", ["strict", "fused"])
def test_flips_of_the_same_elements_share_one_program(mode):
    """``flip`` runs at its canonical dims (wrapped, sorted, size-1 dims dropped): PyTorch's
    own tests flip along every permutation of the dims, each a program of its own before."""
    x = torch.arange(2 * 3 * 1 * 5, dtype=torch.float32).reshape(2, 3, 1, 5)
    with torch_tpu.eager_mode(mode):
        on_tpu = x.to("tpu")
        on_tpu.flip((0, 1, 3)).cpu()
        before = _executables_built()
        for dims in [(0, 1, 3), (3, 1, 0), (-4, 1, -1, 2), (1, 2, 0, 3)]:
            assert torch.equal(on_tpu.flip(dims).cpu(), x.flip(dims))
        assert _executables_built() == before
        for bad in [(0, -4), (4,)]:  # CPU's errors, not the canonical call's
            with pytest.raises(Exception) as expected:
                x.flip(bad)
            with pytest.raises(type(expected.value), match=f"^{re.escape(str(expected.value))}$"):
                on_tpu.flip(bad)


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32, torch.complex64, torch.int32, torch.bool])
def test_assert_close_compares_in_one_program_per_shape(dtype):
    """``isclose`` (CompositeImplicitAutograd: a dozen ops per call on CPU) is one tpu program,
    so ``assert_close`` of two tpu tensors of a new shape compiles it and the ``all``, no more."""
    cpu = (torch.arange(12.0).reshape(3, 4) - 5).to(dtype)
    a, b = cpu.to("tpu"), (cpu + torch.ones((), dtype=dtype)).to("tpu")
    torch.testing.assert_close(a, a)  # (the comparison's other programs, made once)
    shape = (5, 7)
    x = torch.ones(shape, dtype=dtype, device="tpu")
    before = _executables_built()
    torch.testing.assert_close(x, x.clone())
    assert _executables_built() - before <= 2
    with pytest.raises(AssertionError, match="Mismatched elements"):
        torch.testing.assert_close(a, b)
    assert (
        torch.isclose(a, b).cpu().tolist() == torch.isclose(cpu, cpu + torch.ones((), dtype=dtype)).tolist()
    )


@pytest.mark.parametrize("mode", ["strict", "fused"])
def test_a_masked_write_of_a_number_or_row_needs_no_count(mode):
    """``x[mask] = v`` with ``v`` a number or a row of the dims after the mask's is a
    ``masked_fill``, as PyTorch's ``index_put_`` makes it: a new mask of a known shape compiles
    nothing and reads nothing back; values that need the count still take the general path."""
    torch.manual_seed(0)
    x = torch.randn(6, 5, 3)
    with torch_tpu.eager_mode(mode):
        on_tpu = x.to("tpu")

        def put(key, value, accumulate=False):
            indices = key if isinstance(key, tuple) else (key,)
            return on_tpu.index_put(
                tuple(None if i is None else i.to("tpu") for i in indices), value.to("tpu"), accumulate
            ).cpu()

        mask = torch.randn(6, 5) > 0
        row = torch.tensor([1.0, 2.0, 3.0])
        assert torch.equal(put(mask, torch.tensor(0.0)), x.index_put((mask,), torch.tensor(0.0)))
        assert torch.equal(put(mask, row, True), x.index_put((mask,), row, True))
        assert torch.equal(put(mask, row), x.index_put((mask,), row))
        before = _executables_built()
        for _ in range(3):
            mask = torch.randn(6, 5) > 0
            assert torch.equal(put(mask, row), x.index_put((mask,), row))
        assert _executables_built() == before
        column = torch.randn(5) > 0
        aten = torch.ops.aten.index_put.default
        on_cpu = aten(x, [None, column], row)
        assert torch.equal(aten(on_tpu, [None, column.to("tpu")], row.to("tpu")).cpu(), on_cpu)
        counted = torch.randn(int(mask.sum()), 3)
        assert torch.equal(put(mask, counted), x.index_put((mask,), counted))
        with pytest.raises(RuntimeError, match=r"shape mismatch: value tensor of shape \[2\]"):
            put(mask, torch.ones(2))


@pytest.mark.parametrize("listing_bytes", [None, 0])
def test_nonzero_coordinates_equal_cpus_on_the_host_and_on_the_device(listing_bytes, monkeypatch):
    """Small inputs are listed on the host (no program per count), large ones on the device."""
    from torch_tpu.ops import indexing

    if listing_bytes is not None:
        monkeypatch.setattr(indexing, "HOST_LISTING_BYTES", listing_bytes)
    torch.manual_seed(1)
    for x in [
        torch.randn(4, 5),
        torch.randint(0, 2, (3, 2, 2)),
        torch.tensor([0.0, float("nan"), 2]),
        torch.zeros(3, 0),
    ]:
        on_tpu = x.to("tpu")
        assert torch.equal(torch.nonzero(on_tpu).cpu(), torch.nonzero(x))
        mask = x > 0
        assert torch.equal(on_tpu[mask.to("tpu")].cpu(), x[mask])
        assert all(
            torch.equal(a.cpu(), b) for a, b in zip(on_tpu.nonzero(as_tuple=True), x.nonzero(as_tuple=True))
        )
    assert torch.nonzero(torch.tensor(3.0, device="tpu")).shape == (1, 0)
    assert torch.nonzero(torch.tensor(0, device="tpu")).shape == (0, 0)


def test_an_unwritten_storage_of_a_new_size_is_read_without_a_program(monkeypatch):
    """``torch.empty(n)`` read before anything wrote it (``torch.empty(n).uniform_()``, whose
    lowering takes its input) is zeros built on the host: no program per new ``n``. (Buckets
    off: at a line whose sizes change, ``torch.empty`` is padded, its zeros a fill of the
    bucket, which other tests' fills of that shape may have made recur.)"""
    monkeypatch.setattr(torch_tpu.config, "buckets", False)
    torch.tensor([1.0], device="tpu").cpu()
    before = _executables_built()
    for n in (1237, 1241, 1243):
        assert torch.empty(n, device="tpu").cpu().shape == (n,)
    assert _executables_built() == before


def test_an_unwritten_storage_takes_the_shape_of_its_first_whole_reader(monkeypatch):
    """``torch.empty(m, n)`` read whole and in order (``make_tensor``'s ``uniform_``) gets its
    zeros in that shape: no program reshaping a flat storage for each new shape. A reader of
    part of it still sees zeros."""
    monkeypatch.setattr(torch_tpu.config, "buckets", False)
    torch.tensor([1.0], device="tpu").cpu()
    before = _executables_built()
    for m, n in ((13, 17), (19, 23), (29, 31)):
        x = torch.empty(m, n, device="tpu")
        assert torch.equal(x.cpu(), torch.zeros(m, n))
    assert _executables_built() == before
    part = torch.empty(6, 7, device="tpu")[1:, ::2]
    assert torch.equal(part.cpu(), torch.zeros(5, 4))


def test_small_unwritten_storages_never_compile_zeros(monkeypatch):
    """Small unwritten storages read again and again (a test's ``make_tensor`` of one shape)
    get their zeros from the host every time, not a program once the size recurs; large ones
    still follow the fills' rule."""
    from torch_tpu.runtime import transfer

    monkeypatch.setattr(torch_tpu.config, "buckets", False)
    torch.tensor([1.0], device="tpu").cpu()
    before = _executables_built()
    for _ in range(transfer.HOST_FILLS + 3):
        assert torch.equal(torch.empty(41, 3, device="tpu").cpu(), torch.zeros(41, 3))
    assert _executables_built() == before
    large = transfer.SMALL_HOST_FILL_BYTES // 4 + 7
    for _ in range(transfer.HOST_FILLS + 1):
        torch.empty(large, device="tpu").cpu()
    assert _executables_built() > before  # (its zeros became a program)


def test_randint_draws_any_range_with_one_program_per_shape(monkeypatch):
    """``randint``'s bounds are its program's arguments (a test's indices into each size it
    makes): new bounds compile nothing, and the values stay in range."""
    monkeypatch.setattr(torch_tpu.config, "buckets", False)
    torch.randint(0, 3, (11,), device="tpu").cpu()
    before = _executables_built()
    for low, high in ((0, 4), (0, 5), (0, 1000), (-7, 2)):
        x = torch.randint(low, high, (11,), device="tpu").cpu()
        assert low <= int(x.min()) and int(x.max()) < high
    assert _executables_built() == before
