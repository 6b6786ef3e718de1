"""vLLM's rejection-sampling kernels (speculative decoding) as torch ops on tpu tensors.

vLLM's rejection sampler (``vllm/v1/sample/rejection_sampler.py``) launches four Triton kernels,
one program per request (or per draft token); the CPU platform replaces them with C++ loops.
Here each is one JAX function over the whole batch: the loops over a request's draft tokens
become masks over a ``[requests, max_spec_len]`` grid (a draft is written up to and including
the first one rejected; a request with none rejected also gets its bonus token), so a step
launches one program per kernel whatever the requests' draft counts.

A request's draft tokens are ``draft_token_ids[start:end]``, where ``end`` is its entry of
``cu_num_draft_tokens`` and ``start`` the entry before (0 for the first).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from torch_tpu.pallas import jax_op


def _take(x: jax.Array, index: jax.Array) -> jax.Array:
    """``x[index]`` along the first dimension, for indices that may point one past the end
    (masked positions of requests with fewer drafts; ``x`` may be empty)."""
    padded = jnp.pad(x, [(0, 1)] + [(0, 0)] * (x.ndim - 1))
    return padded[jnp.clip(index, 0, x.shape[0])]


def _starts(cu: jax.Array) -> jax.Array:
    """Each request's first draft token (the cumulative counts shifted by one)."""
    return jnp.concatenate([jnp.zeros(1, jnp.int32), cu[:-1].astype(jnp.int32)])


def _grid(cu: jax.Array, width: int) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Per request and draft position ``[requests, width]``: the draft token's index, whether the
    request has that many drafts; and each request's draft count."""
    end, start = cu.astype(jnp.int32), _starts(cu)
    position = jnp.arange(width, dtype=jnp.int32)
    count = end - start
    return start[:, None] + position, position < count[:, None], count


def _by_position(rates: jax.Array, width: int) -> jax.Array:
    """``rates[position]`` for each draft position ``[1, width]`` (synthetic mode's acceptance
    rate of the position)."""
    return _take(rates, jnp.arange(width))[None, :]


def _request_of_token(cu: jax.Array, tokens: int) -> tuple[jax.Array, jax.Array]:
    """Each token's request (``len(cu)`` past the last) and its position in the request."""
    t = jnp.arange(tokens, dtype=jnp.int32)
    request = jnp.searchsorted(cu.astype(jnp.int32), t, side="right").astype(jnp.int32)
    return request, t - _take(_starts(cu), request)


def _write_accepted(out, tokens, accepted, valid, count, bonus, rows) -> jax.Array:
    """``out`` with each of ``rows``' drafts written up to and including its first rejection,
    and its bonus token after its drafts when none was rejected."""
    rejected = valid & ~accepted
    earlier = (jnp.cumsum(rejected, axis=1) - rejected) > 0
    write = valid & ~earlier & rows[:, None]
    drafts = jnp.where(write, tokens.astype(out.dtype), out[:, :-1])
    written = jnp.concatenate([drafts, out[:, -1:]], axis=1)
    at_bonus = (jnp.arange(out.shape[1])[None, :] == count[:, None]) & (rows & ~rejected.any(1))[:, None]
    return jnp.where(at_bonus, bonus.reshape(-1, 1).astype(out.dtype), written)


def _greedy_sample(
    out: jax.Array,
    cu: jax.Array,
    draft: jax.Array,
    target_argmax: jax.Array,
    bonus: jax.Array,
    is_greedy: jax.Array | None,
    uniform: jax.Array | None,
    rates: jax.Array | None,
) -> jax.Array:
    """Greedy requests: a draft is accepted where it is the target's argmax (synthetic mode: with
    probability ``rates[position]``, the target's argmax written where it is not)."""
    index, valid, count = _grid(cu, out.shape[1] - 1)
    d, target = _take(draft, index), _take(target_argmax, index)
    if rates is None:
        accepted, tokens = d == target, target
    else:
        accepted = (_take(uniform, index) < _by_position(rates, index.shape[1])) & (d >= 0)
        tokens = jnp.where(accepted, d, target)
    rows = jnp.ones(out.shape[0], bool) if is_greedy is None else is_greedy
    return _write_accepted(out, tokens, accepted, valid, count, bonus, rows)


def _random_sample(
    out: jax.Array,
    cu: jax.Array,
    draft: jax.Array,
    draft_probs: jax.Array | None,
    target_probs: jax.Array,
    bonus: jax.Array,
    recovered: jax.Array,
    uniform: jax.Array,
    is_greedy: jax.Array,
    rates: jax.Array | None,
) -> jax.Array:
    """Sampled requests: draft ``d`` is accepted where ``target_prob[d] / draft_prob[d] >= u``
    (no draft probabilities: a draft probability of 1), else replaced by its recovered token;
    padded drafts (-1) are rejected."""
    index, valid, count = _grid(cu, out.shape[1] - 1)
    d, u = _take(draft, index), _take(uniform, index)
    if rates is not None:
        accepted = u < _by_position(rates, index.shape[1])
    else:
        rows_of = jnp.clip(index, 0, target_probs.shape[0] - 1)
        column = jnp.clip(d, 0, target_probs.shape[1] - 1)
        target = target_probs[rows_of, column]
        drafted = jnp.ones_like(target) if draft_probs is None else draft_probs[rows_of, column]
        accepted = (drafted > 0) & ((target / drafted).astype(u.dtype) >= u)
    accepted = accepted & (d >= 0)
    tokens = jnp.where(accepted, d, _take(recovered, index))
    return _write_accepted(out, tokens, accepted, valid, count, bonus, ~is_greedy)


def _expand(
    out: jax.Array, values: jax.Array, cu: jax.Array, *, replace_from: float, replace_to: float, most: int
) -> jax.Array:
    """Each request's value (``replace_from`` replaced by ``replace_to``) at its tokens' places,
    at most ``most`` of them."""
    request, position = _request_of_token(cu, out.shape[0])
    value = jnp.where(values == replace_from, jnp.asarray(replace_to).astype(values.dtype), values)
    inside = (request < cu.shape[0]) & (position < most)
    return jnp.where(inside, _take(value, request).astype(out.dtype), out)


def _recovered_tokens(
    out: jax.Array,
    cu: jax.Array,
    draft: jax.Array,
    draft_probs: jax.Array | None,
    target_probs: jax.Array,
    inv_q: jax.Array,
) -> jax.Array:
    """Each draft token's replacement: the argmax of ``max(target - draft, 0) * inv_q`` over the
    vocabulary (no draft probabilities: the target's, the draft token's own left out), the
    product in ``inv_q``'s precision as the kernel takes it."""
    request, _ = _request_of_token(cu, out.shape[0])
    vocab = target_probs.shape[1]
    if draft_probs is None:
        own = jnp.arange(vocab)[None, :] == draft[:, None]
        probs = jnp.where(own, 0.0, target_probs)
    else:
        probs = jnp.maximum(target_probs - draft_probs, 0.0)
    score = probs.astype(inv_q.dtype) * _take(inv_q, request)
    ids = jnp.minimum(jnp.argmax(score, axis=1), vocab - 1)
    return jnp.where(request < cu.shape[0], ids.astype(out.dtype), out)


@functools.cache
def _ops() -> dict:
    """The ops, defined at the first launch (defining an op starts the device)."""
    return {
        "greedy": jax_op("torch_tpu::vllm_rejection_greedy", _greedy_sample, autograd=False),
        "random": jax_op("torch_tpu::vllm_rejection_random", _random_sample, autograd=False),
        "expand": jax_op("torch_tpu::vllm_expand", _expand, autograd=False),
        "recovered": jax_op("torch_tpu::vllm_recovered_tokens", _recovered_tokens, autograd=False),
    }


# -- the kernels' replacements (their parameters by the kernels' names)


def rejection_greedy_sample(
    output_token_ids_ptr,
    cu_num_draft_tokens_ptr,
    draft_token_ids_ptr,
    target_argmax_ptr,
    bonus_token_ids_ptr,
    is_greedy_ptr,
    max_spec_len,
    uniform_probs_ptr,
    synthetic_conditional_rates_ptr,
    SYNTHETIC_MODE,
) -> None:
    rates = synthetic_conditional_rates_ptr if SYNTHETIC_MODE else None
    uniform = uniform_probs_ptr if SYNTHETIC_MODE else None
    out = output_token_ids_ptr
    args = (cu_num_draft_tokens_ptr, draft_token_ids_ptr, target_argmax_ptr, bonus_token_ids_ptr)
    out.copy_(_ops()["greedy"](out, *args, is_greedy_ptr, uniform, rates))


def rejection_random_sample(
    output_token_ids_ptr,
    cu_num_draft_tokens_ptr,
    draft_token_ids_ptr,
    draft_probs_ptr,
    target_probs_ptr,
    bonus_token_ids_ptr,
    recovered_token_ids_ptr,
    uniform_probs_ptr,
    is_greedy_ptr,
    max_spec_len,
    vocab_size,
    synthetic_conditional_rates_ptr,
    NO_DRAFT_PROBS,
    SYNTHETIC_MODE,
) -> None:
    out = output_token_ids_ptr
    out.copy_(
        _ops()["random"](
            out,
            cu_num_draft_tokens_ptr,
            draft_token_ids_ptr,
            None if NO_DRAFT_PROBS else draft_probs_ptr,
            target_probs_ptr,
            bonus_token_ids_ptr,
            recovered_token_ids_ptr,
            uniform_probs_ptr,
            is_greedy_ptr,
            synthetic_conditional_rates_ptr if SYNTHETIC_MODE else None,
        )
    )


def expand(output_ptr, input_ptr, cu_num_tokens_ptr, replace_from, replace_to, MAX_NUM_TOKENS) -> None:
    output_ptr.copy_(
        _ops()["expand"](
            output_ptr,
            input_ptr,
            cu_num_tokens_ptr,
            replace_from=float(replace_from),
            replace_to=float(replace_to),
            most=int(MAX_NUM_TOKENS),
        )
    )


def sample_recovered_tokens(
    output_token_ids_ptr,
    cu_num_draft_tokens_ptr,
    draft_token_ids_ptr,
    draft_probs_ptr,
    target_probs_ptr,
    inv_q_ptr,
    vocab_size,
    BLOCK_SIZE,
    NO_DRAFT_PROBS,
    USE_FP64_GUMBEL,
) -> None:
    out = output_token_ids_ptr
    draft_probs = None if NO_DRAFT_PROBS else draft_probs_ptr
    args = (cu_num_draft_tokens_ptr, draft_token_ids_ptr, draft_probs, target_probs_ptr, inv_q_ptr)
    out.copy_(_ops()["recovered"](out, *args))


_MODULE = "vllm.v1.sample.rejection_sampler"
OVERRIDES = {
    f"{_MODULE}.rejection_greedy_sample_kernel": rejection_greedy_sample,
    f"{_MODULE}.rejection_random_sample_kernel": rejection_random_sample,
    f"{_MODULE}.expand_kernel": expand,
    f"{_MODULE}.sample_recovered_tokens_kernel": sample_recovered_tokens,
}
