"""Flash attention as Pallas kernels: softmax(q k^T * scale + bias) v over blocks of queries and
keys with an online softmax (a running row maximum and sum), so the [L, S] score matrix never
exists whole; the backward recomputes each block's probabilities from the saved logsumexp.

Layout ``[batch, heads, length, head_dim]``; keys and values may have fewer heads than queries
(grouped-query attention: query head ``h`` reads key/value head ``h // (heads / kv_heads)``).
``causal`` masks key ``j`` for query ``i`` when ``j > i`` (PyTorch's ``is_causal``: the [L, S]
lower triangle, aligned top left). A query whose keys are all masked gives zeros, as PyTorch's
math path does, and a logsumexp of -inf."""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from ..pallas import interpret_mode
from ..pallas._blocks import block, compiler_params, pad_to

#: query and key rows per block on a TPU
BLOCK_Q = 128
BLOCK_K = 128
_PARALLEL = ("parallel", "parallel", "parallel", "arbitrary")


def _dot(a, b, contract=(1, 0)):
    """``a @ b`` contracting ``a``'s axis ``contract[0]`` with ``b``'s ``contract[1]``, in float32."""
    dims = (((contract[0],), (contract[1],)), ((), ()))
    return lax.dot_general(a, b, dims, preferred_element_type=jnp.float32)


class _Blocks:
    """The static shape of one call: block lengths, padded lengths, grid and block specs."""

    def __init__(self, q, k, bias, causal, block_q, block_k):
        self.batch, self.heads, self.q_len, self.head_dim = q.shape
        self.kv_heads, self.kv_len = k.shape[1], k.shape[2]
        self.causal = causal
        self.bq, self.bk = block(self.q_len, block_q), block(self.kv_len, block_k)
        self.nq, self.nk = -(-self.q_len // self.bq), -(-self.kv_len // self.bk)
        self.bias_batch = bias is not None and bias.shape[0] > 1
        self.bias_heads = bias is not None and bias.shape[1] > 1

    @property
    def kv_padded(self) -> bool:
        return self.nk * self.bk != self.kv_len

    # index maps take the grid position; the query/key block indices are named, whichever
    # axis of the grid they are on
    def q_spec(self, position, width=None):
        """A block of query rows (``width`` columns, default the head dimension)."""

        def index(*g):
            b, h, i, _ = position(*g)
            return b, h, i, 0

        return pl.BlockSpec((None, None, self.bq, width or self.head_dim), index)

    def row_spec(self, position):
        """One float per query row (logsumexp, rowsum(dO * O)), as a [bq, 1] column."""
        return self.q_spec(position, 1)

    def kv_spec(self, position):
        rep = self.heads // self.kv_heads

        def index(*g):
            b, h, _, j = position(*g)
            return b, h // rep, j, 0

        return pl.BlockSpec((None, None, self.bk, self.head_dim), index)

    def kv_out_spec(self, position):
        """A key block's gradient, per query head (summed over a key/value head's group after)."""

        def index(*g):
            b, h, _, j = position(*g)
            return b, h, j, 0

        return pl.BlockSpec((None, None, self.bk, self.head_dim), index)

    def bias_spec(self, position):
        def index(*g):
            b, h, i, j = position(*g)
            return (b if self.bias_batch else 0, h if self.bias_heads else 0, i, j)

        return pl.BlockSpec((None, None, self.bq, self.bk), index)

    def scores(self, q, k, bias_ref, scale, i, j):
        """The block's scores in float32, -inf where masked (causal, or keys past the end)."""
        s = _dot(q, k, (1, 1)) * scale
        if bias_ref is not None:
            s = s + bias_ref[...].astype(jnp.float32)
        valid = None
        cols = j * self.bk + lax.broadcasted_iota(jnp.int32, s.shape, 1)
        if self.causal:
            valid = cols <= i * self.bq + lax.broadcasted_iota(jnp.int32, s.shape, 0)
        if self.kv_padded:
            in_range = cols < self.kv_len
            valid = in_range if valid is None else valid & in_range
        return s if valid is None else jnp.where(valid, s, -jnp.inf)

    def when_visible(self, i, j, body, otherwise=None):
        """Run ``body`` unless causality masks the whole block (all its keys after its queries)."""
        if not self.causal:
            return body()
        visible = j * self.bk <= i * self.bq + self.bq - 1
        pl.when(visible)(body)
        if otherwise is not None:
            pl.when(jnp.logical_not(visible))(otherwise)


def _bias_args(bias):
    return () if bias is None else (bias,)


# ----------------------------------------------------------------------------- forward
def _forward_kernel(q_ref, k_ref, v_ref, *refs, blocks, scale, has_bias):
    bias_ref, refs = (refs[0], refs[1:]) if has_bias else (None, refs)
    o_ref, lse_ref, m_ref, l_ref, acc_ref = refs
    i, j = pl.program_id(2), pl.program_id(3)

    @pl.when(j == 0)
    def _():
        m_ref[...] = jnp.full_like(m_ref, -jnp.inf)
        l_ref[...] = jnp.zeros_like(l_ref)
        acc_ref[...] = jnp.zeros_like(acc_ref)

    def step():
        s = blocks.scores(q_ref[...], k_ref[...], bias_ref, scale, i, j)
        m_prev = m_ref[...]
        m_new = jnp.maximum(m_prev, s.max(axis=1, keepdims=True))
        # a row with every score so far masked keeps -inf; subtracting 0 then gives exp = 0
        m_safe = jnp.where(m_new == -jnp.inf, 0.0, m_new)
        p = jnp.exp(s - m_safe)
        alpha = jnp.exp(m_prev - m_safe)
        l_ref[...] = alpha * l_ref[...] + p.sum(axis=1, keepdims=True)
        v = v_ref[...]
        acc_ref[...] = alpha * acc_ref[...] + _dot(p.astype(v.dtype), v)
        m_ref[...] = m_new

    blocks.when_visible(i, j, step)

    @pl.when(j == pl.num_programs(3) - 1)
    def _():
        total = l_ref[...]
        empty = total == 0
        o_ref[...] = (acc_ref[...] / jnp.where(empty, 1.0, total)).astype(o_ref.dtype)
        lse_ref[...] = jnp.where(empty, -jnp.inf, m_ref[...] + jnp.log(jnp.where(empty, 1.0, total)))


def _pad_inputs(blocks, q, k, v, bias, *rows):
    """q (and the per-query ``rows``) padded to whole query blocks, k, v to whole key blocks,
    bias to both (padded keys are masked in the kernel, padded queries dropped after it)."""
    q = pad_to(q, 2, blocks.bq)
    k, v = pad_to(k, 2, blocks.bk), pad_to(v, 2, blocks.bk)
    if bias is not None:
        bias = pad_to(pad_to(bias, 2, blocks.bq), 3, blocks.bk)
    return (q, k, v, bias, *(pad_to(r, 2, blocks.bq) for r in rows))


def flash_attention_forward(
    q, k, v, bias=None, *, causal=False, scale=None, block_q=BLOCK_Q, block_k=BLOCK_K, interpret=None
):
    """(output ``[B, H, L, D]`` in q's dtype, logsumexp ``[B, H, L]`` float32). ``bias``: None
    or a float array ``[B or 1, H or 1, L, S]`` added to the scaled scores (-inf masks)."""
    blocks = _Blocks(q, k, bias, causal, block_q, block_k)
    scale = 1 / math.sqrt(blocks.head_dim) if scale is None else float(scale)
    q_p, k_p, v_p, bias_p = _pad_inputs(blocks, q, k, v, bias)

    def position(b, h, i, j):
        return b, h, i, j

    with interpret_mode(interpret):
        out, lse = pl.pallas_call(
            functools.partial(_forward_kernel, blocks=blocks, scale=scale, has_bias=bias is not None),
            out_shape=(
                jax.ShapeDtypeStruct(q_p.shape, q.dtype),
                jax.ShapeDtypeStruct((*q_p.shape[:3], 1), jnp.float32),
            ),
            grid=(blocks.batch, blocks.heads, blocks.nq, blocks.nk),
            in_specs=[
                blocks.q_spec(position),
                blocks.kv_spec(position),
                blocks.kv_spec(position),
                *([blocks.bias_spec(position)] if bias is not None else []),
            ],
            out_specs=(blocks.q_spec(position), blocks.row_spec(position)),
            scratch_shapes=[
                pltpu.VMEM((blocks.bq, 1), jnp.float32),
                pltpu.VMEM((blocks.bq, 1), jnp.float32),
                pltpu.VMEM((blocks.bq, blocks.head_dim), jnp.float32),
            ],
            compiler_params=compiler_params(*_PARALLEL),
            name="flash_attention_forward",
        )(q_p, k_p, v_p, *_bias_args(bias_p))
    return out[:, :, : blocks.q_len], lse[:, :, : blocks.q_len, 0]


# ----------------------------------------------------------------------------- backward
def _probabilities(blocks, q_ref, k_ref, bias_ref, lse_ref, scale, i, j):
    s = blocks.scores(q_ref[...], k_ref[...], bias_ref, scale, i, j)
    lse = lse_ref[...]
    # a fully masked row (lse -inf) has every score -inf: exp(-inf - inf) = 0, not nan
    return jnp.exp(s - jnp.where(lse == -jnp.inf, jnp.inf, lse))


def _score_gradient(blocks, p, do_ref, v_ref, delta_ref):
    """d(scores) = p * (dO v^T - rowsum(dO * O)) (the softmax's backward)."""
    return p * (_dot(do_ref[...], v_ref[...], (1, 1)) - delta_ref[...])


def _dkv_kernel(q_ref, k_ref, v_ref, *refs, blocks, scale, has_bias):
    bias_ref, refs = (refs[0], refs[1:]) if has_bias else (None, refs)
    lse_ref, delta_ref, do_ref, dk_ref, dv_ref, dk_acc, dv_acc = refs
    j, i = pl.program_id(2), pl.program_id(3)

    @pl.when(i == 0)
    def _():
        dk_acc[...] = jnp.zeros_like(dk_acc)
        dv_acc[...] = jnp.zeros_like(dv_acc)

    def step():
        p = _probabilities(blocks, q_ref, k_ref, bias_ref, lse_ref, scale, i, j)
        do = do_ref[...]
        dv_acc[...] += _dot(p.astype(do.dtype), do, (0, 0))
        ds = _score_gradient(blocks, p, do_ref, v_ref, delta_ref)
        q = q_ref[...]
        dk_acc[...] += _dot(ds.astype(q.dtype), q, (0, 0)) * scale

    blocks.when_visible(i, j, step)

    @pl.when(i == pl.num_programs(3) - 1)
    def _():
        dk_ref[...] = dk_acc[...]
        dv_ref[...] = dv_acc[...]


def _dq_kernel(q_ref, k_ref, v_ref, *refs, blocks, scale, has_bias, bias_grad):
    bias_ref, refs = (refs[0], refs[1:]) if has_bias else (None, refs)
    lse_ref, delta_ref, do_ref, dq_ref, *rest = refs
    dbias_ref, dq_acc = rest if bias_grad else (None, rest[0])
    i, j = pl.program_id(2), pl.program_id(3)

    @pl.when(j == 0)
    def _():
        dq_acc[...] = jnp.zeros_like(dq_acc)

    def step():
        p = _probabilities(blocks, q_ref, k_ref, bias_ref, lse_ref, scale, i, j)
        ds = _score_gradient(blocks, p, do_ref, v_ref, delta_ref)
        k = k_ref[...]
        dq_acc[...] += _dot(ds.astype(k.dtype), k) * scale
        if dbias_ref is not None:
            dbias_ref[...] = ds

    def masked_block():
        dbias_ref[...] = jnp.zeros_like(dbias_ref)

    blocks.when_visible(i, j, step, masked_block if bias_grad else None)

    @pl.when(j == pl.num_programs(3) - 1)
    def _():
        dq_ref[...] = dq_acc[...].astype(dq_ref.dtype)


@dataclasses.dataclass(frozen=True)
class _BackwardInputs:
    """The backward kernels' operands, padded to whole blocks, in the kernels' argument order."""

    q: jax.Array
    k: jax.Array
    v: jax.Array
    bias: jax.Array | None
    lse: jax.Array
    delta: jax.Array
    do: jax.Array

    @classmethod
    def padded(cls, blocks, q, k, v, bias, out, lse, grad):
        # delta = rowsum(dO * O), the softmax backward's per-row term
        delta = jnp.sum(grad.astype(jnp.float32) * out.astype(jnp.float32), axis=-1, keepdims=True)
        return cls(*_pad_inputs(blocks, q, k, v, bias, lse[..., None], delta, grad.astype(q.dtype)))

    @property
    def has_bias(self) -> bool:
        return self.bias is not None

    def args(self):
        return (self.q, self.k, self.v, *_bias_args(self.bias), self.lse, self.delta, self.do)

    def specs(self, blocks, position):
        return [
            blocks.q_spec(position),
            blocks.kv_spec(position),
            blocks.kv_spec(position),
            *([blocks.bias_spec(position)] if self.has_bias else []),
            blocks.row_spec(position),
            blocks.row_spec(position),
            blocks.q_spec(position),
        ]


def _key_gradients(blocks, inputs, scale, interpret):
    """(dk, dv) per query head, padded: one key block per program, the query blocks its
    reduction (the last grid axis)."""

    def by_key(b, h, j, i):
        return b, h, i, j

    kv_shape = jax.ShapeDtypeStruct((blocks.batch, blocks.heads, *inputs.k.shape[2:]), jnp.float32)
    with interpret_mode(interpret):
        return pl.pallas_call(
            functools.partial(_dkv_kernel, blocks=blocks, scale=scale, has_bias=inputs.has_bias),
            out_shape=(kv_shape, kv_shape),
            grid=(blocks.batch, blocks.heads, blocks.nk, blocks.nq),
            in_specs=inputs.specs(blocks, by_key),
            out_specs=(blocks.kv_out_spec(by_key), blocks.kv_out_spec(by_key)),
            scratch_shapes=[pltpu.VMEM((blocks.bk, blocks.head_dim), jnp.float32)] * 2,
            compiler_params=compiler_params(*_PARALLEL),
            name="flash_attention_backward_dkv",
        )(*inputs.args())


def _query_gradients(blocks, inputs, scale, bias_grad, interpret):
    """(dq, dbias or None), padded: one query block per program, the key blocks its reduction;
    dbias is the scores' gradient, [B, H, L, S]."""

    def by_query(b, h, i, j):
        return b, h, i, j

    dq_shape = jax.ShapeDtypeStruct(inputs.q.shape, inputs.q.dtype)
    dq_spec = blocks.q_spec(by_query)
    out_shape, out_specs = (dq_shape,), (dq_spec,)
    if bias_grad:
        padded = (blocks.batch, blocks.heads, inputs.q.shape[2], inputs.k.shape[2])
        out_shape += (jax.ShapeDtypeStruct(padded, jnp.float32),)
        out_specs += (pl.BlockSpec((None, None, blocks.bq, blocks.bk), by_query),)
    with interpret_mode(interpret):
        dq, *dbias = pl.pallas_call(
            functools.partial(
                _dq_kernel, blocks=blocks, scale=scale, has_bias=inputs.has_bias, bias_grad=bias_grad
            ),
            out_shape=out_shape,
            grid=(blocks.batch, blocks.heads, blocks.nq, blocks.nk),
            in_specs=inputs.specs(blocks, by_query),
            out_specs=out_specs,
            scratch_shapes=[pltpu.VMEM((blocks.bq, blocks.head_dim), jnp.float32)],
            compiler_params=compiler_params(*_PARALLEL),
            name="flash_attention_backward_dq",
        )(*inputs.args())
    return dq, (dbias[0] if bias_grad else None)


def _per_kv_head(blocks, g, like):
    """A key/value head's gradient: the sum of those of the query heads that read it."""
    g = g[:, :, : blocks.kv_len].reshape(blocks.batch, blocks.kv_heads, -1, *like.shape[2:])
    return g.sum(2).astype(like.dtype)


def _bias_gradient(blocks, dbias, bias):
    """The scores' gradient summed down to the bias's shape (over its broadcast axes)."""
    dbias = dbias[:, :, : blocks.q_len, : blocks.kv_len]
    broadcast = tuple(a for a in (0, 1) if bias.shape[a] == 1)
    return dbias.sum(broadcast, keepdims=True).astype(bias.dtype)


def flash_attention_backward(
    q,
    k,
    v,
    bias,
    out,
    lse,
    grad,
    *,
    causal=False,
    scale=None,
    bias_grad=False,
    block_q=BLOCK_Q,
    block_k=BLOCK_K,
    interpret=None,
):
    """(dq, dk, dv, dbias) for :func:`flash_attention_forward`'s ``out`` and ``lse`` and the
    output's cotangent ``grad``; dbias is None unless ``bias_grad`` (it is [B, H, L, S], summed
    to the bias's shape here)."""
    blocks = _Blocks(q, k, bias, causal, block_q, block_k)
    scale = 1 / math.sqrt(blocks.head_dim) if scale is None else float(scale)
    inputs = _BackwardInputs.padded(blocks, q, k, v, bias, out, lse, grad)
    dk, dv = _key_gradients(blocks, inputs, scale, interpret)
    dq, dbias = _query_gradients(blocks, inputs, scale, bias_grad, interpret)
    return (
        dq[:, :, : blocks.q_len],
        _per_kv_head(blocks, dk, k),
        _per_kv_head(blocks, dv, v),
        None if dbias is None else _bias_gradient(blocks, dbias, bias),
    )


# ----------------------------------------------------------------------------- differentiable
@functools.partial(jax.custom_vjp, nondiff_argnums=(4,))
def _flash(q, k, v, bias, options):
    return flash_attention_forward(q, k, v, bias, **options.forward)[0]


def _flash_fwd(q, k, v, bias, options):
    out, lse = flash_attention_forward(q, k, v, bias, **options.forward)
    return out, (q, k, v, bias, out, lse)


def _flash_bwd(options, residuals, grad):
    q, k, v, bias, out, lse = residuals
    dq, dk, dv, dbias = flash_attention_backward(*residuals[:4], out, lse, grad, **options.backward)
    if bias is not None and dbias is None:
        dbias = jnp.zeros_like(bias)
    return dq, dk, dv, dbias


class _Options(tuple):
    """The static keyword arguments (hashable, for custom_vjp's nondiff argument)."""

    @property
    def forward(self):
        return {name: value for name, value in self if name != "bias_grad"}

    @property
    def backward(self):
        return dict(self)


_flash.defvjp(_flash_fwd, _flash_bwd)


def as_bias(mask, shape, dtype=jnp.float32):
    """An attention mask as an additive float bias of ``[B or 1, H or 1, L, S]`` (``shape`` is
    ``[B, H, L, S]``): a boolean mask (True attends) becomes 0 / -inf; a float one is added."""
    if mask is None:
        return None
    if mask.dtype == jnp.bool_:
        mask = jnp.where(mask, 0.0, -jnp.inf).astype(dtype)
    mask = jnp.reshape(mask, (1,) * (4 - mask.ndim) + mask.shape)
    kept = tuple(n if m != 1 else 1 for n, m in zip(shape[:2], mask.shape[:2]))
    return jnp.broadcast_to(mask, (*kept, *shape[2:]))


def flash_attention(
    q,
    k,
    v,
    mask=None,
    *,
    causal=False,
    scale=None,
    mask_grad=False,
    block_q=BLOCK_Q,
    block_k=BLOCK_K,
    interpret=None,
):
    """``softmax(q k^T * scale + mask) v`` for ``q`` ``[B, H, L, D]``, ``k``, ``v``
    ``[B, H_kv, S, D]``; ``scale`` defaults to ``1/sqrt(D)``. ``mask``: None, boolean (True
    attends) or additive float, broadcastable to ``[B, H, L, S]``. Differentiable: the backward
    is two Pallas kernels (key/value blocks, query blocks). A float mask's cotangent is computed
    only with ``mask_grad=True`` (it is a [B, H, L, S] array); otherwise the mask is a constant.
    ``interpret``: where the kernels run, as
    :func:`torch_tpu.pallas.interpret_mode` takes it (None: compiled on TPUs, interpreted
    elsewhere; True: interpreted everywhere)."""
    if q.ndim != 4 or k.ndim != 4 or v.ndim != 4:
        raise ValueError(f"flash_attention: q, k, v must be [B, H, L, D]: {q.shape}, {k.shape}, {v.shape}")
    if k.shape != v.shape or k.shape[0] != q.shape[0] or k.shape[3] != q.shape[3] or q.shape[1] % k.shape[1]:
        raise ValueError(f"flash_attention: incompatible q {q.shape}, k {k.shape}, v {v.shape}")
    bias = as_bias(mask, (*q.shape[:3], k.shape[2]))
    if bias is not None and not mask_grad:
        bias = lax.stop_gradient(bias)
    options = _Options(
        sorted(
            dict(
                causal=bool(causal),
                scale=None if scale is None else float(scale),
                bias_grad=bool(mask_grad and bias is not None and jnp.issubdtype(mask.dtype, jnp.floating)),
                block_q=block_q,
                block_k=block_k,
                interpret=interpret,
            ).items()
        )
    )
    return _flash(q, k, v, bias, options)
