"""Size buckets: values padded to a bucket along dimensions whose size changes, never visible.

Exactness: every op family with a padding rule (``ops/padding.py``) runs on operands padded at
sizes inside a bucket, at its boundary, of 1, and gives CPU's forward and backward results
(tolerances from the float64 reference); its OpInfo samples, padded, too. Compiles: a new size
inside a compiled bucket compiles nothing. Invisibility: sizes, strides, views, host copies and
in-place updates see the logical tensor.
"""

from __future__ import annotations

import jax
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch.testing._internal.common_methods_invocations import op_db
from torch.utils._pytree import tree_flatten, tree_map

import torch_tpu
from torch_tpu.runtime import buffer, padding, tensor
from torch_tpu.runtime.padding import Factor, Layout
from torch_tpu.testing.reference import assert_matches_cpu, widened


def padded(x: torch.Tensor, dims=None) -> torch.Tensor:
    """CPU tensor ``x`` on tpu, its storage padded along ``dims`` (default: every dim of size 1 or
    more) as a tensor learned dynamic there would be."""
    dims = [d for d in range(x.dim()) if x.shape[d]] if dims is None else dims
    layout = Layout.of(tuple(x.shape), dims)
    value = padding.from_host(np.asarray(x.detach().numpy()), layout, jax.devices()[0])
    t = tensor.wrap_padded(value)
    return t.requires_grad_(x.requires_grad) if x.is_leaf else t


def is_padded(t: torch.Tensor) -> bool:
    return type(buffer.peek(t.untyped_storage())) is buffer.Padded


def compiles() -> int:
    return torch.tpu.compilation_cache_stats()["xla_compiles"]


# ----------------------------------------------------------------------------- layouts
def test_the_ladder_is_powers_of_two_from_eight():
    assert [padding.bucket(n) for n in (1, 7, 8, 9, 16, 17, 33, 64, 65)] == [8, 8, 8, 16, 16, 32, 64, 64, 128]


def test_a_growth_factor_gives_a_finer_ladder(monkeypatch):
    monkeypatch.setattr(torch_tpu.config, "bucket_growth", 1.25)
    assert [padding.bucket(n) for n in (9, 11, 13, 16, 20)] == [10, 13, 13, 17, 22]


@pytest.mark.parametrize("value", ["0", "off", "1", "pow2", "1.5"])
def test_the_switch_parses(value):
    growth = torch_tpu.config._buckets(value)
    assert growth == {"0": None, "off": None, "1": 2.0, "pow2": 2.0, "1.5": 1.5}[value]


def test_the_switch_refuses_a_ladder_that_does_not_grow():
    with pytest.raises(ValueError, match="TORCH_TPU_BUCKETS"):
        torch_tpu.config._buckets("0.5")


def test_host_padding_round_trips_merged_dims():
    layout = Layout(((Factor(3), Factor(5, 8)), (Factor(4),)))
    x = np.arange(60).reshape(15, 4)
    host = padding.pad_host(x, layout)
    assert host.shape == (24, 4)
    np.testing.assert_array_equal(padding.unpad_host(host, layout), x)


_MERGED = Layout(((Factor(2), Factor(37, 64)), (Factor(12),)))  # a (B * T, 3C) projection
_GEOMETRIES = [
    ((74, 12), (12, 1), 0),  # the whole
    ((2, 37, 12), (444, 12, 1), 0),  # its (B, T, 3C) view
    ((2, 37, 4), (444, 12, 1), 4),  # split into q, k, v
    ((2, 37, 2, 2), (444, 12, 2, 1), 8),  # heads
    ((2, 2, 37, 2), (444, 2, 12, 1), 8),  # heads transposed
    ((12, 74), (1, 12), 0),  # .t()
    ((74, 1, 12), (12, 12, 1), 0),  # unsqueezed
    ((74, 3, 12), (12, 0, 1), 0),  # expanded
    ((74, 6), (12, 2), 0),  # every other channel
    ((2, 36, 12), (444, 12, 1), 12),  # [:, 1:] (shifted labels)
    ((2, 36, 12), (444, 12, 1), 0),  # [:, :-1] (shifted logits)
    ((2, 30, 12), (444, 12, 1), 24),  # [:, 2:32]
]


@pytest.mark.parametrize("shape, strides, offset", _GEOMETRIES)
def test_a_view_of_a_padded_storage_reads_the_logical_elements(shape, strides, offset):
    flat = np.arange(74 * 12, dtype=np.float32)
    host = padding.pad_host(flat.reshape(74, 12), _MERGED)
    plan, layout = padding.plan_view(_MERGED, shape, strides, offset)
    got = padding.unpad_host(np.asarray(padding.read_view(jax.numpy.asarray(host), plan)), layout)
    expected = np.lib.stride_tricks.as_strided(flat[offset:], shape, [s * 4 for s in strides])
    np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize(
    "shape, strides, offset",
    [((37, 12), (12, 1), 444), ((2, 12), (444, 1), 432), ((60, 12), (12, 1), 0)],
    ids=["a batch row", "the last position", "a slice of the merged length"],
)
def test_views_that_cut_a_padded_dimension_are_read_unpadded(shape, strides, offset):
    assert padding.plan_view(_MERGED, shape, strides, offset) is None


# ----------------------------------------------------------------------------- learning
def _site(shapes, make):
    """The tensors ``make(shape)`` makes from one line, for each shape."""
    return [make(shape) for shape in shapes]


def test_a_dimension_is_dynamic_once_its_size_changed():
    made = _site([(3, 5), (3, 6), (3, 9), (4, 9)], lambda s: torch.ones(s).to("tpu"))
    assert [is_padded(t) for t in made] == [False, True, True, True]
    assert buffer.peek(made[2].untyped_storage()).layout.padded_shape == (3, 16)
    assert buffer.peek(made[3].untyped_storage()).layout.padded_shape == (8, 16)  # (dim 0 changed too)


def test_factories_and_ranges_learn_as_copies_do():
    ones = _site([(5, 7), (6, 7), (9, 7)], lambda s: torch.ones(s, device="tpu"))
    ranges = _site([5, 6, 9], lambda n: torch.arange(n, device="tpu"))
    assert [is_padded(t) for t in ones + ranges] == [False, True, True, False, True, True]
    assert ranges[-1].tolist() == list(range(9))


def test_sizes_zero_and_one_teach_nothing_and_stay_unpadded():
    # Dynamo's 0/1 specialization: a generation loop's prompt (length P) and its steps (length 1)
    ranges = _site([7, 1, 1, 7, 0, 5, 1, 9], lambda n: torch.arange(n, device="tpu"))
    assert [is_padded(t) for t in ranges] == [False, False, False, False, False, True, False, True]
    first_is_one = _site([(1, 4), (6, 4), (9, 4)], lambda s: torch.zeros(s, device="tpu"))
    assert [is_padded(t) for t in first_is_one] == [False, False, True]
    assert [t.tolist() for t in ranges[5:]] == [list(range(5)), [0], list(range(9))]


def test_parameters_are_never_padded():
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Linear(16, 3), torch.nn.Linear(3, 5))
    model.to("tpu")
    assert not any(is_padded(p) for p in model.parameters())


def test_fused_eager_pads_as_strict_eager_does():
    with torch_tpu.eager_mode("fused"):
        made = _site([(3, 5), (3, 6), (3, 9)], lambda s: torch.ones(s, device="tpu") * 2)
        assert [is_padded(t) for t in made] == [False, True, True]
        assert made[2].sum().item() == 54


def test_buckets_off_pads_nothing(run_python):
    out = run_python(
        """
        import torch, torch_tpu
        from torch_tpu.runtime import buffer
        made = [torch.ones(3, n).to("tpu") for n in (5, 6, 9)]
        print(sum(type(buffer.peek(t.untyped_storage())) is buffer.Padded for t in made))
        """,
        TORCH_TPU_BUCKETS="0",
    )
    assert out.strip() == "0"


# ----------------------------------------------------------------------------- invisible
def test_a_padded_tensor_is_its_logical_tensor():
    x = torch.arange(33.0).reshape(3, 11)
    t = padded(x)
    assert is_padded(t)
    assert (t.shape, t.stride(), t.numel(), t.is_contiguous()) == (x.shape, x.stride(), 33, True)
    assert t.untyped_storage().nbytes() == 33 * 4
    torch.testing.assert_close(t.cpu(), x)
    assert t.tolist() == x.tolist() and t[2, 10].item() == 32.0
    assert str(t).startswith("tensor([[ 0.,  1.,") and str(t).endswith("device='tpu:0')")
    torch.testing.assert_close(t[:, 3:7].cpu(), x[:, 3:7])  # (a cut of a padded dim: read unpadded)
    torch.testing.assert_close(t.t().contiguous().cpu(), x.t().contiguous())
    torch.testing.assert_close(t.view(-1).cpu(), x.view(-1))


def test_in_place_updates_of_a_padded_tensor():
    x = torch.arange(33.0).reshape(3, 11)
    t = padded(x)
    t.add_(1)
    assert is_padded(t)
    t[:, 2] = -1.0  # (a partial write: the storage is rewritten unpadded)
    x.add_(1)
    x[:, 2] = -1.0
    torch.testing.assert_close(t.cpu(), x)
    t.zero_()
    assert t.abs().sum().item() == 0


def test_saving_and_copying_a_padded_tensor(tmp_path):
    x = torch.randn(3, 11)
    t = padded(x)
    torch.save(t, tmp_path / "t.pt")
    torch.testing.assert_close(torch.load(tmp_path / "t.pt").cpu(), x)
    import copy

    torch.testing.assert_close(copy.deepcopy(t).cpu(), x)
    torch.testing.assert_close(t.to(torch.float64).cpu(), x.double())


# ----------------------------------------------------------------------------- exactness
SIZES = [1, 7, 8, 9, 16]  # (inside a bucket, its boundary, the first past it, one)


def _assert_like_cpu(fn, *inputs, grad=True, dims=None, stays_padded=True):
    """``fn`` on padded tpu inputs against CPU and a float64 reference: outputs, and the inputs'
    gradients of the outputs' sum; ``stays_padded``: the first output is padded (the rule ran,
    not the unpadded reading every op falls back to)."""
    cpu = [x.clone().requires_grad_(grad and x.is_floating_point()) for x in inputs]
    wide = [widened(x.detach()).requires_grad_(grad and x.is_floating_point()) for x in inputs]
    per_input = dims if dims and isinstance(dims[0], list) else [dims] * len(inputs)
    tpu = [
        padded(x.detach(), d).requires_grad_(grad and x.is_floating_point())
        for x, d in zip(inputs, per_input)
    ]
    outs = [fn(*args) for args in (tpu, cpu, wide)]
    leaves = [[o for o in tree_flatten(out)[0] if isinstance(o, torch.Tensor)] for out in outs]
    assert not stays_padded or is_padded(leaves[0][0]), f"{fn.__name__} ran unpadded"
    for a, e, r in zip(*leaves):
        assert a.shape == e.shape and a.dtype == e.dtype
        assert_matches_cpu(a, e, r, what=f"{fn.__name__} forward")
    if not grad:
        return
    floats = [i for i, x in enumerate(inputs) if x.is_floating_point()]
    grads = []
    for args, ls in zip((tpu, cpu, wide), leaves):
        total = sum(
            o.float().sum() if o.dtype == torch.float64 else o.sum() for o in ls if o.is_floating_point()
        )
        grads.append(torch.autograd.grad(total, [args[i] for i in floats], allow_unused=True))
    for a, e, r in zip(*grads):
        if e is not None:
            assert_matches_cpu(a, e, r, what=f"{fn.__name__} backward")


def pointwise(x, y):
    return F.gelu(x * y + 1).exp() - torch.where(x > 0, x, y)


def reductions(x):
    return x.sum(), x.sum(1), x.amax(-1, keepdim=True), x.max(1).values, x.logsumexp(1), x.mean(0)


def indices(x):
    return x.argmax(1), x.max(0).indices, x.argmin(-1)


def softmaxes(x):
    return F.softmax(x, 1), F.log_softmax(x, -1), F.softmax(x, 0)


def matmuls(x, w, b):
    return (
        F.linear(x, w, b),
        x @ x.transpose(1, 2),
        torch.baddbmm(x @ x.transpose(1, 2), x, x.transpose(1, 2)),
    )


def layer_norm(x, w, b):
    return F.layer_norm(x, (x.shape[-1],), w, b)


def attention(q, k, v):
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def concatenated(x, y):
    return torch.cat([x, y * 2], dim=-1)


@pytest.mark.parametrize("n", SIZES)
def test_pointwise_ops_are_exact(n):
    _assert_like_cpu(pointwise, torch.randn(3, n), torch.randn(n))


@pytest.mark.parametrize("n", SIZES)
def test_reductions_are_exact(n):
    _assert_like_cpu(reductions, torch.randn(n, n + 2, 3), stays_padded=False)  # (the first: a sum of all)
    _assert_like_cpu(indices, torch.randn(n, n + 2), grad=False)


@pytest.mark.parametrize("n", SIZES)
def test_integer_reductions_are_exact(n):
    x = torch.randint(-50, 50, (n, 5))
    for fn in (lambda t: t.sum(0), lambda t: t.amax(0), lambda t: t.amin(0), lambda t: t.prod(0)):
        assert torch.equal(fn(padded(x)).cpu(), fn(x))


@pytest.mark.parametrize("n", SIZES)
def test_softmax_is_exact(n):
    _assert_like_cpu(softmaxes, torch.randn(n, n + 1))


@pytest.mark.parametrize("n", SIZES)
def test_matmuls_are_exact(n):
    _assert_like_cpu(matmuls, torch.randn(2, n, 6), torch.randn(4, 6), torch.randn(4))


@pytest.mark.parametrize("n", SIZES)
def test_layer_norm_is_exact(n):
    _assert_like_cpu(layer_norm, torch.randn(2, n, 6), torch.randn(6), torch.randn(6), dims=[1])


@pytest.mark.parametrize("n", SIZES)
def test_causal_attention_is_exact(n):
    q, k, v = (torch.randn(2, 3, n, 4) for _ in range(3))
    _assert_like_cpu(attention, q, k, v, dims=[2])


def masked_attention(q, k, v, keep, bias):
    """Attention as Hugging Face masks it: a boolean causal mask and a padding mask, broadcast
    over the heads; and an additive mask."""
    n = q.shape[-2]
    causal = torch.ones(n, n, dtype=torch.bool, device=q.device).tril()
    mask = causal[None, None] & keep[:, None, None, :]
    return (
        F.scaled_dot_product_attention(q, k, v, attn_mask=mask),
        F.scaled_dot_product_attention(q, k, v, attn_mask=bias),
    )


@pytest.mark.parametrize("n", SIZES)
def test_masked_attention_is_exact(n):
    q, k, v = (torch.randn(2, 3, n, 4) for _ in range(3))
    keep = torch.ones(2, n, dtype=torch.bool)
    keep[1, n // 2 + 1 :] = False  # (right padding)
    keep[0, : n // 3] = False  # (left padding: rows with every key masked)
    bias = torch.randn(2, 1, n, n).masked_fill(torch.rand(2, 1, n, n) > 0.7, float("-inf"))
    bias[..., 0] = 0.0
    dims = [[2], [2], [2], [1], [2, 3]]
    # (at 1, the mask's view is all unit dims: which holds the padded one is ambiguous, it reads unpadded)
    _assert_like_cpu(masked_attention, q, k, v, keep, bias, dims=dims, stays_padded=n > 1)


def masked_softmax(x):
    """What AOTAutograd makes of a causal attention: a mask from ``ones``, ``tril``, ``where``."""
    mask = torch.ones(x.shape[-2:], dtype=torch.bool, device=x.device).tril()
    bias = torch.where(mask, 0.0, float("-inf"))
    return torch.ops.aten._safe_softmax(x + bias, -1), x.triu(1) * 2


@pytest.mark.parametrize("n", SIZES)
def test_triangles_and_safe_softmax_are_exact(n):
    _assert_like_cpu(masked_softmax, torch.randn(2, n, n), dims=[1, 2])


def rms_and_masks(x, m):
    """An RMS norm (a mean over the static hidden dim), a mask filled in, factories like it."""
    rms = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
    return rms, x.masked_fill(m, -1.0), torch.zeros_like(x) + x, torch.ones_like(x) * x


@pytest.mark.parametrize("n", SIZES)
def test_static_means_masked_fills_and_like_factories_are_exact(n):
    _assert_like_cpu(rms_and_masks, torch.randn(2, n, 6), torch.randn(2, n, 6) > 0, dims=[1])


def cache_grown_from_nothing(k):
    empty = torch.zeros(2, 3, 0, 4, device=k.device)
    legacy = torch.tensor([], device=k.device)  # (a DynamicCache's first update: cat skips it)
    return torch.cat([empty, k], dim=-2) * 2, torch.cat([legacy, k], dim=-2)


@pytest.mark.parametrize("n", SIZES)
def test_concatenation_onto_empty_is_exact(n):
    _assert_like_cpu(cache_grown_from_nothing, torch.randn(2, 3, n, 4), dims=[2])


def shifted(x):
    """A language model's shifted logits and labels: slices of a dynamic dim from a fixed start."""
    return x[:, 1:] * 2, x[:, :-1] + 1, x[:, 1:] - x[:, :-1], x[:, 2:-1].exp()


@pytest.mark.parametrize("n", [7, 8, 9, 16])
def test_slices_from_a_fixed_start_are_exact(n):
    _assert_like_cpu(shifted, torch.randn(2, n, 5), dims=[1])


def rotated_halves(x):
    """Rotary embeddings' ``rotate_half``: slices and a select of the static last dim, whose
    gradients (``slice_backward``, ``select_backward``) keep the padded one."""
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), -1) * 2 + x.select(-1, 1)[..., None]


@pytest.mark.parametrize("n", SIZES)
def test_slices_of_a_static_dim_and_their_gradients_are_exact(n):
    _assert_like_cpu(rotated_halves, torch.randn(2, n, 4), dims=[1])


def causal_lm_loss(logits, labels):
    """Hugging Face's ``ForCausalLMLoss``: labels padded by one and shifted (their bucket grows
    by one), token losses over the flattened logits."""
    shifted = F.pad(labels, (0, 1), value=-100)[..., 1:]
    flat = logits.view(-1, logits.shape[-1])
    targets = shifted.reshape(-1)
    return F.cross_entropy(flat, targets, reduction="none"), F.cross_entropy(flat, targets)


@pytest.mark.parametrize("n", [7, 8, 9, 16])  # (at 1 every label is ignored: the mean is nan)
def test_shifted_labels_meet_their_logits(n):
    _assert_like_cpu(causal_lm_loss, torch.randn(2, n, 5), torch.randint(0, 5, (2, n)), dims=[1])


def padded_ends(x, labels):
    return F.pad(x, (1, 2, 0, 3), value=0.5), F.pad(labels, (0, 1), value=-100)[..., 1:]


@pytest.mark.parametrize("n", SIZES)
def test_constant_padding_at_the_end_is_exact(n):
    _assert_like_cpu(padded_ends, torch.randn(2, n, 3), torch.randint(0, 5, (2, n)), dims=[1])


@pytest.mark.parametrize("n", SIZES)
def test_concatenation_is_exact(n):
    _assert_like_cpu(concatenated, torch.randn(2, n, 3), torch.randn(2, n, 4), dims=[1])


@pytest.mark.parametrize("n", SIZES)
def test_embedding_and_cross_entropy_are_exact(n):
    table = torch.randn(10, 5)
    ids = torch.randint(0, 10, (2, n))
    targets = torch.randint(0, 10, (2, n))
    targets[0, 0] = -100  # (ignored, as padding is)

    def model(table, ids, targets):
        logits = F.embedding(ids, table) @ table.t()
        return F.cross_entropy(logits.flatten(0, 1), targets.reshape(-1)), F.cross_entropy(
            logits.flatten(0, 1), targets.reshape(-1), reduction="none"
        )

    _assert_like_cpu(model, table, ids, targets, dims=[1], stays_padded=False)  # (a mean)


def advanced_indexing(x, positions):
    """Advanced indexing by integer tensors: Hugging Face's ``padding_mask[batch_idx, kv_idx]``
    (broadcast aranges), negative and repeated positions, indices apart."""
    batch = torch.arange(x.shape[0], device=x.device)
    return (
        x[batch[:, None, None], positions[None, None, :]] * 2,
        x[:, positions.flip(0) - x.shape[1]],
        x[batch[0], :, positions[0:1] * 0] + 1,
        x[[[1], [0]], positions],
    )


@pytest.mark.parametrize("n", SIZES)
def test_advanced_indexing_is_exact(n):
    x, positions = torch.randn(2, n, 3), torch.arange(n)
    _assert_like_cpu(advanced_indexing, x, positions, dims=[[1], [0]], stays_padded=n > 1)


def test_advanced_indices_out_of_bounds_raise_as_on_cpu():
    x, positions = padded(torch.randn(2, 9, 3), [1]), padded(torch.arange(9), [0])
    assert is_padded(x[:, positions])
    for bad in (positions + 1, -positions - 2, positions - 10):
        with pytest.raises(IndexError) as cpu:
            x.cpu()[:, bad.cpu()]
        with pytest.raises(IndexError, match="out of bounds for dimension 0 with size 9") as tpu:
            x[:, bad].cpu()
        assert str(tpu.value) == str(cpu.value)
    assert float(x.sum()) == pytest.approx(float(x.cpu().sum()))  # (still usable)


def test_padded_indices_out_of_bounds_raise_as_on_cpu():
    ids = padded(torch.tensor([[1, 2, 12]]))
    with pytest.raises(IndexError, match="index out of range in self"):
        F.embedding(ids, torch.randn(10, 3, device="tpu"))
    targets = padded(torch.tensor([1, 2, 30]))
    with pytest.raises(IndexError, match="Target 30 is out of bounds"):
        F.cross_entropy(torch.randn(3, 10, device="tpu"), targets)
    assert F.embedding(padded(torch.tensor([[1, 2]])), torch.ones(10, 3, device="tpu")).sum().item() == 6


# ----------------------------------------------------------------------------- OpInfo samples, padded
PADDED_OPINFOS = [
    "add",
    "sub",
    "mul",
    "div.no_rounding_mode",
    "exp",
    "tanh",
    "sigmoid",
    "clamp",
    "where",
    "masked_fill",
    "maximum",
    "pow",
    "nn.functional.gelu",
    "nn.functional.silu",
    "sum",
    "amax",
    "amin",
    "prod",
    "logsumexp",
    "mean",
    "argmax",
    "max.reduction_with_dim",
    "softmax",
    "log_softmax",
    "tril",
    "triu",
    "mm",
    "addmm",
    "bmm",
    "matmul",
    "nn.functional.linear",
    "nn.functional.layer_norm",
    "nn.functional.embedding",
    "nn.functional.cross_entropy",
    "cat",
    "nn.functional.pad.constant",
    "nn.functional.nll_loss",
    "__getitem__",
    "index_put",
    "cumsum",
    "cumprod",
]
_BY_NAME = {(f"{op.name}.{op.variant_test_name}" if op.variant_test_name else op.name): op for op in op_db}


def _padded_arg(x):
    if isinstance(x, torch.Tensor) and x.dim() and x.numel() and x.dtype != torch.bool:
        return padded(x.detach()).requires_grad_(x.requires_grad)
    if isinstance(x, torch.Tensor):
        moved = x.detach().to("tpu")
        return moved.requires_grad_(x.requires_grad) if x.is_leaf else moved
    return x


@pytest.mark.parametrize("name", PADDED_OPINFOS)
def test_opinfo_samples_on_padded_inputs_match_cpu(name):
    op = _BY_NAME[name]
    samples = list(op.sample_inputs("cpu", torch.float32, requires_grad=True))[:4]
    for sample in samples:
        args = (sample.input, sample.args, sample.kwargs)
        expected = op(args[0], *args[1], **args[2])
        reference = op(
            *tree_map(widened, args[:1]), *tree_map(widened, args[1]), **tree_map(widened, args[2])
        )
        moved = tree_map(_padded_arg, args)
        actual = op(moved[0], *moved[1], **moved[2])
        for a, e, r in zip(tree_flatten(actual)[0], tree_flatten(expected)[0], tree_flatten(reference)[0]):
            if isinstance(e, torch.Tensor):
                assert_matches_cpu(a, e, r, what=f"{name} forward")
        outs = [
            (a, e) for a, e in zip(tree_flatten(actual)[0], tree_flatten(expected)[0]) if _differentiable(e)
        ]
        if not outs:
            continue
        tpu_inputs = [x for x in tree_flatten(moved)[0] if isinstance(x, torch.Tensor) and x.requires_grad]
        cpu_inputs = [x for x in tree_flatten(args)[0] if isinstance(x, torch.Tensor) and x.requires_grad]
        grads = torch.autograd.grad([a.sum() for a, _ in outs], tpu_inputs, allow_unused=True)
        expected_grads = torch.autograd.grad([e.sum() for _, e in outs], cpu_inputs, allow_unused=True)
        for a, e in zip(grads, expected_grads):
            if e is not None:
                torch.testing.assert_close(
                    a.cpu(), e, rtol=1e-4, atol=1e-4, msg=lambda m: f"{name} backward: {m}"
                )


def _differentiable(x) -> bool:
    return isinstance(x, torch.Tensor) and x.requires_grad and x.is_floating_point()


# ----------------------------------------------------------------------------- compiles
def test_a_new_size_inside_a_compiled_bucket_compiles_nothing():
    def run(n):
        return float((torch.ones(n, 7, device="tpu") * 2).sum())

    for n in (33, 40):  # (the second size makes the dimension dynamic and compiles the bucket)
        assert run(n) == 14 * n
    before = compiles()
    for n in (45, 50, 57, 64):
        assert run(n) == 14 * n
    assert compiles() - before <= 1  # (a fill made often enough runs as a program: once)


@pytest.mark.parametrize("mode", ["strict", "fused"])
def test_training_steps_at_new_lengths_in_a_bucket_compile_nothing(mode):
    from torch_tpu.demo.model import GPT, GPTConfig

    torch.manual_seed(0)
    config = GPTConfig(vocab_size=32, block_size=32, n_layer=1, n_head=2, n_embd=16)
    model = GPT(config)
    reference = GPT(config)
    reference.load_state_dict(model.state_dict())
    model.to("tpu")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1)

    def step(net, optimizer, device, x, y):
        _, loss = net(x.to(device), y.to(device))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        return loss.item()

    counts = []
    for n in (9, 10, 11, 13, 14):  # (one bucket: 16)
        x, y = torch.randint(0, 32, (2, n)), torch.randint(0, 32, (2, n))
        before = compiles()
        with torch_tpu.eager_mode(mode):
            loss = step(model, opt, "tpu", x, y)
        counts.append(compiles() - before)
        assert loss == pytest.approx(step(reference, ref_opt, "cpu", x, y), rel=1e-5, abs=1e-6)
    assert counts[3:] == [0, 0], counts
    for p, q in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(p.cpu(), q, rtol=1e-4, atol=1e-5)


# ----------------------------------------------------------------------------- docs
def test_the_module_examples_run():
    import doctest

    assert doctest.testmod(padding).failed == 0


def test_the_execution_docs_example_runs():
    import pathlib

    text = (pathlib.Path(__file__).parents[1] / "docs" / "execution.md").read_text()
    section = text.split("## Shapes that change")[1].split("\n## ")[0]
    snippets = [part.split("```")[0] for part in section.split("```python\n")[1:]]
    assert len(snippets) == 4  # (eager, torch.compile, warm-up, background compiles)
    before = compiles()
    exec(compile(snippets[0], "docs/execution.md", "exec"), {})
    assert compiles() - before <= 5  # (the first two sizes' programs; none after)
    for code in snippets[1:]:
        exec(compile(code, "docs/execution.md", "exec"), {})


@pytest.mark.parametrize("n", [1, 9, 16])
def test_the_rules_are_exact_in_fused_eager(n):
    def block(x, w, b):
        h = F.layer_norm(x, (6,)) @ w.t() + b
        q = h.view(2, n, 2, 3).transpose(1, 2)
        a = F.scaled_dot_product_attention(q, q, q, is_causal=True).transpose(1, 2).reshape(2, n, 6)
        return F.log_softmax(F.gelu(a), -1) * x

    with torch_tpu.eager_mode("fused"):
        _assert_like_cpu(block, torch.randn(2, n, 6), torch.randn(6, 6), torch.randn(6), dims=[1])


def test_masks_and_indices_are_exact_in_fused_eager():
    q, k, v = (torch.randn(2, 3, 9, 4) for _ in range(3))
    keep = torch.ones(2, 9, dtype=torch.bool)
    keep[1, 5:] = False
    bias = torch.randn(2, 1, 9, 9)
    with torch_tpu.eager_mode("fused"):
        _assert_like_cpu(masked_attention, q, k, v, keep, bias, dims=[[2], [2], [2], [1], [2, 3]])
        _assert_like_cpu(advanced_indexing, torch.randn(2, 9, 3), torch.arange(9), dims=[[1], [0]])
        x = padded(torch.randn(2, 9, 3), [1])
        with pytest.raises(IndexError, match="index 9 is out of bounds for dimension 0 with size 9"):
            x[:, padded(torch.arange(9), [0]) + 1].cpu()


# ----------------------------------------------------------------------------- torch.compile
def test_compiled_graphs_with_symbolic_sizes_compile_once_per_bucket():
    def f(x):
        return (x * 2).softmax(-1).sum(0)

    fn = torch.compile(f, backend="tpu", dynamic=None)
    fn(torch.randn(8, 5, device="tpu"))
    counts = []
    for n in (11, 13, 16, 9, 12):  # (Dynamo makes the size symbolic at 11; all in bucket 16)
        x = torch.randn(n, 5)
        before = compiles()
        torch.testing.assert_close(fn(x.to("tpu")).cpu(), f(x), rtol=1e-5, atol=1e-6)
        counts.append(compiles() - before)
    assert counts[1:] == [0, 0, 0, 0], counts


def test_compiled_training_at_changing_lengths_matches_cpu():
    from torch_tpu.demo.model import GPT, GPTConfig

    torch.manual_seed(0)
    config = GPTConfig(vocab_size=32, block_size=32, n_layer=1, n_head=2, n_embd=16)
    model, reference = GPT(config), GPT(config)
    reference.load_state_dict(model.state_dict())
    model.to("tpu")
    compiled = torch.compile(model, backend="tpu", dynamic=None)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1)
    counts = []
    for n in (5, 9, 10, 13, 12, 14):  # (symbolic from 9 on; one bucket: 16)
        x, y = torch.randint(0, 32, (2, n)), torch.randint(0, 32, (2, n))
        before = compiles()
        _, loss = compiled(x.to("tpu"), y.to("tpu"))
        loss.backward()
        opt.step()
        opt.zero_grad()
        counts.append(compiles() - before)
        _, expected = reference(x, y)
        expected.backward()
        ref_opt.step()
        ref_opt.zero_grad()
        assert loss.item() == pytest.approx(expected.item(), rel=1e-5, abs=1e-6)
    assert counts[3:] == [0, 0, 0], counts
    for p, q in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(p.cpu(), q, rtol=1e-4, atol=1e-5)


def test_a_bucketed_graph_writes_its_inputs():
    def f(x, total):
        total.add_(x.sum(0))
        return x.cumsum(0)  # (no padding rule: read unpadded)

    fn = torch.compile(f, backend="tpu", dynamic=True)
    total, expected = torch.zeros(3, device="tpu"), torch.zeros(3)
    for n in (6, 7, 9):
        x = torch.randn(n, 3)
        torch.testing.assert_close(fn(x.to("tpu"), total).cpu(), f(x, expected), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(total.cpu(), expected, rtol=1e-5, atol=1e-6)


def test_bounded_dynamism_off_compiles_per_size():
    def f(x):
        return x.exp().sum(0)

    fn = torch.compile(f, backend="tpu", dynamic=True, options={"bounded_dynamism": False})
    fn(torch.ones(9, 2, device="tpu"))
    programs = torch.tpu.compilation_cache_stats()["compiled_graphs"]  # (built, or read from disk)
    assert fn(torch.ones(10, 2, device="tpu")).cpu().tolist() == pytest.approx([10 * np.e] * 2)
    assert torch.tpu.compilation_cache_stats()["compiled_graphs"] == programs + 1


def test_compile_options_are_checked():
    graph = torch.fx.symbolic_trace(lambda t: t + 1)
    x = torch.ones(2, device="tpu")
    with pytest.raises(RuntimeError, match=r"unknown options \['trace.enabled'\]"):
        torch_tpu.frontends.compile.backend(graph, [x], options={"trace.enabled": True})
    with pytest.raises(TypeError, match="bounded_dynamism"):
        torch_tpu.frontends.compile.backend(graph, [x], options={"bounded_dynamism": "yes"})


def test_a_pickled_program_keeps_its_symbolic_sizes():
    import pickle

    from torch_tpu.frontends.compile.program import Program

    seen = []

    def backend(graph_module, example_inputs):
        seen.append(Program(graph_module))
        return graph_module.forward

    torch.compile(lambda x: x * 2, backend=backend, dynamic=True)(torch.ones(4, 3))
    program = pickle.loads(pickle.dumps(seen[0]))
    assert program.symbolic.dims == seen[0].symbolic.dims and program.bucketed
    assert not program.symbolic.automatic  # (dynamic=True: dims pad once seen to change)


def test_mark_dynamic_bounds_the_buckets():
    fn = torch.compile(lambda x: x * 2, backend="tpu")
    for n in (10, 33):
        x = tensor.wrap(jax.numpy.ones((n, 3), np.float32))  # (made unpadded: the graph pads it)
        torch._dynamo.mark_dynamic(x, 0, min=2, max=48)
        y = fn(x)
        assert buffer.peek(y.untyped_storage()).layout.padded_shape == ((16, 3) if n == 10 else (48, 3))
        assert y.cpu().sum().item() == 6 * n


# ----------------------------------------------------------------------------- warm-up
def test_async_compile_warms_the_buckets_a_model_meets():
    from torch_tpu.demo.model import GPT, GPTConfig

    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=32, block_size=64, n_layer=1, n_head=2, n_embd=16)).to("tpu")
    compiled = torch.compile(model, backend="tpu", dynamic=True)

    def step(x, y):
        compiled(x, y)[1].backward()

    inputs = [tuple(torch.randint(0, 32, (2, n), device="tpu") for _ in "xy") for n in (16, 32, 64)]
    warm = torch_tpu.async_compile(step, inputs)
    assert warm.wait(timeout=600).calls == 3 and warm.done()
    model.zero_grad()
    counts = []
    for n in (11, 30, 50, 12, 31, 51):  # (in the warmed buckets 16, 32, 64)
        x, y = torch.randint(0, 32, (2, n)), torch.randint(0, 32, (2, n))
        before = compiles()
        _, loss = compiled(x.to("tpu"), y.to("tpu"))
        loss.backward()
        counts.append(compiles() - before)
        model.zero_grad()
    # (unwarmed: a forward and a backward program per bucket; warmed, a one-off fill at most,
    # once made often enough to run as a program instead of on the host)
    assert sum(counts[:3]) <= 2 and counts[3:] == [0, 0, 0], counts


def test_async_compile_raises_what_a_warm_up_call_raised():
    def fn(x):
        raise ValueError(f"bad input of {x.shape[0]}")

    warm = torch_tpu.async_compile(fn, [torch.ones(3)])
    with pytest.raises(ValueError, match="bad input of 3"):
        warm.wait()
    with pytest.raises(TypeError, match="needs a callable"):
        torch_tpu.async_compile(None, [])
    with pytest.raises(ValueError, match="workers"):
        torch_tpu.async_compile(fn, [], workers=0)


def test_the_warm_up_example_runs():
    import doctest

    from torch_tpu.execution import warmup

    assert doctest.testmod(warmup).failed == 0


def _random_walk_put(n: int) -> tuple:
    """PyTorch's ``test_index_put_accumulate_duplicate_indices``, one size of its loop."""
    delta = torch.empty(n, dtype=torch.float64, device="tpu").uniform_(-1, 1)
    indices = delta.cumsum(0).long()
    x = torch.randn(int(indices.abs().max()) + 1, device="tpu")
    values = torch.randn(indices.size(0), device="tpu")
    return x, indices, values, x.index_put((indices,), values, accumulate=True)


def test_random_fills_scans_and_puts_at_new_sizes_in_a_bucket_compile_nothing():
    """A loop over sizes: ``torch.empty(n)`` and ``torch.randn(n)`` are learned factories, random
    fills, ``cumsum`` and ``index_put`` run padded, and each result equals CPU's."""
    torch.manual_seed(0)  # (the walks' lengths, and so the buckets of ``x``, are the seed's)
    for n in (17, 18):
        _random_walk_put(n)
    before = compiles()
    for n in range(19, 31):
        x, indices, values, out = _random_walk_put(n)
        assert is_padded(indices) and is_padded(values) and is_padded(out), n
        expected = x.cpu().index_put((indices.cpu(),), values.cpu(), accumulate=True)
        torch.testing.assert_close(out.cpu(), expected)
        assert torch.equal(indices.cpu(), torch.tensor(indices.tolist()))
    assert compiles() == before


def test_random_draws_padded_keep_the_values_of_the_seed(monkeypatch):
    """A draw at a line whose sizes change is padded along its first dim and holds, at its
    logical positions, the values the unpadded draw gives for the same seed."""

    def draws(n):
        torch.manual_seed(3)
        return (
            torch.randn(n, 2, device="tpu"),
            torch.empty(n, dtype=torch.float64, device="tpu").uniform_(-1, 1),
            torch.rand(n, device="tpu"),
            torch.empty(n, 3, device="tpu").normal_(),
            torch.empty(n, dtype=torch.int64, device="tpu").random_(0, 100),
            torch.empty(n, device="tpu").bernoulli_(0.3),
        )

    sizes = (5, 9, 11, 12)
    got = [draws(n) for n in sizes]
    assert all(is_padded(t) for t in got[-1])
    monkeypatch.setattr(torch_tpu.config, "buckets", False)
    for n, drawn in zip(sizes, got):
        assert all(torch.equal(a.cpu(), b.cpu()) for a, b in zip(drawn, draws(n))), n


def test_a_draw_padded_along_another_dim_is_drawn_unpadded():
    x = padded(torch.zeros(3, 9), [1])
    torch.manual_seed(4)
    drawn = x.uniform_()
    torch.manual_seed(4)
    assert torch.equal(drawn.cpu(), torch.empty(3, 9, device="tpu").uniform_().cpu())
