"""Hugging Face ``generate()`` on tpu: a static, bucketed KV cache and fused decoding by default.

Transformers' default cache grows by one token per step, so every step of strict eager meets
new shapes and compiles new executables (~600 for 32 tokens of a small Llama, 20-30 s on a
CPU stand-in, more on a TPU). When the model is on tpu and the caller chose no cache, greedy
and sampling generation instead get what the caller could have asked for explicitly:

- ``cache_implementation="static"`` with ``max_cache_len`` rounded up to a bucket (a power
  of two from 64), so the cache keeps one shape for the whole call and for later calls
  whose lengths fall in the same bucket. The padding is masked exactly (the static cache's
  own mask), so tokens equal the dynamic cache's;
- the call runs in fused eager (the prefill and each decoding step become one compiled graph
  each), in place of Transformers' automatic ``torch.compile`` of the decoding step, whose
  Dynamo trace costs more than the whole fused generation on a cold start.

A caller who passes ``cache_implementation``, ``past_key_values``, ``compile_config`` or
``use_cache=False`` gets exactly what they asked for; ``TORCH_TPU_STATIC_GENERATION=0`` turns
the default off. The patch is applied when ``transformers.generation.utils`` is imported (now,
if it already is), so ``import torch_tpu`` never imports Transformers itself.

Example::

    >>> from torch_tpu.integrations.generation import cache_length
    >>> cache_length(47, max_positions=2048), cache_length(100, max_positions=128)
    (64, 128)
"""

from __future__ import annotations

import functools

from .. import config
from ..runtime.import_hooks import after_import

#: the smallest cache length: shorter generations share one set of executables
SMALLEST_CACHE = 64
_CACHE_NAMES = ("past_key_values", "cache_params")
_CHOSEN = "_torch_tpu_static_cache"  # marks a generation config whose cache we chose


def cache_length(needed: int, max_positions: int | None = None) -> int:
    """The static cache length for ``needed`` positions: the next power of two from
    :data:`SMALLEST_CACHE`, but no longer than the model's ``max_positions`` when that suffices."""
    length = max(SMALLEST_CACHE, 1 << (needed - 1).bit_length())
    if max_positions is not None and needed <= max_positions < length:
        return max_positions
    return length


def _chooses_cache(model, generation_config, model_kwargs: dict, generation_mode) -> bool:
    from transformers.generation.configuration_utils import GenerationMode

    return (
        config.static_generation
        and model.device.type == "tpu"
        and generation_mode in (GenerationMode.GREEDY_SEARCH, GenerationMode.SAMPLE)
        and generation_config.cache_implementation is None
        and generation_config.compile_config is None
        and generation_config.use_cache is not False
        and not any(model_kwargs.get(name) is not None for name in _CACHE_NAMES)
        and not model.config.is_encoder_decoder
        and model._can_compile_fullgraph  # how Transformers marks models a static cache serves
        and model._supports_default_dynamic_cache()
    )


def _patch(utils) -> None:
    mixin = utils.GenerationMixin
    prepare_cache, sample = mixin._prepare_cache_for_generation, mixin._sample
    if getattr(prepare_cache, "_torch_tpu", False):
        return

    @functools.wraps(prepare_cache)
    def _prepare_cache_for_generation(
        self, generation_config, model_kwargs, generation_mode, batch_size, max_cache_length
    ):
        # ``generation_config`` is this call's own copy: the model's stays as it was
        if _chooses_cache(self, generation_config, model_kwargs, generation_mode):
            max_positions = getattr(
                self.config.get_text_config(decoder=True), "max_position_embeddings", None
            )
            generation_config.cache_implementation = "static"
            generation_config.max_cache_len = cache_length(max_cache_length, max_positions)
            generation_config.disable_compile = True
            setattr(generation_config, _CHOSEN, True)
        return prepare_cache(
            self, generation_config, model_kwargs, generation_mode, batch_size, max_cache_length
        )

    @functools.wraps(sample)
    def _sample(self, input_ids, logits_processor, stopping_criteria, generation_config, *args, **kwargs):
        from ..execution.modes import EagerMode, eager_mode, get_eager_mode

        # debug eager (errors at the op that made them) stays as the caller set it
        if getattr(generation_config, _CHOSEN, False) and get_eager_mode() is EagerMode.STRICT:
            with eager_mode(EagerMode.FUSED):
                return sample(
                    self, input_ids, logits_processor, stopping_criteria, generation_config, *args, **kwargs
                )
        return sample(
            self, input_ids, logits_processor, stopping_criteria, generation_config, *args, **kwargs
        )

    _prepare_cache_for_generation._torch_tpu = True
    mixin._prepare_cache_for_generation = _prepare_cache_for_generation
    mixin._sample = _sample


def install() -> None:
    after_import("transformers.generation.utils", _patch)
