"""Tiny Hugging Face models built offline from configs, and their tpu-vs-CPU comparison.

Every architecture in :data:`ARCHITECTURES` is built with random weights from a fixed seed (no hub
access), then run once on CPU and once on ``tpu`` from the same weights: forward outputs, greedy
``generate()`` and one AdamW training step. :func:`compare` returns the measured differences;
``python -m torch_tpu.testing.hf_zoo`` prints them as the table in ``docs/models.md``.

Example::

    >>> from torch_tpu.testing.hf_zoo import compare
    >>> result = compare("llama", generate_tokens=4)
    >>> result.forward_rel <= 1e-4, result.generate_equal, result.loss_rel <= 1e-4
    (True, True, True)
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

import torch

#: Shared sizes: small enough for a 2-core CI box, large enough for every code path (several
#: heads, grouped-query attention, two layers, experts routed top-2).
_VOCAB, _HIDDEN, _HEADS, _KV_HEADS, _LAYERS, _FFN = 128, 32, 4, 2, 2, 64
_HEAD_DIM = _HIDDEN // _HEADS
_DECODER = dict(
    vocab_size=_VOCAB,
    hidden_size=_HIDDEN,
    intermediate_size=_FFN,
    num_hidden_layers=_LAYERS,
    num_attention_heads=_HEADS,
    num_key_value_heads=_KV_HEADS,
    max_position_embeddings=64,
    head_dim=_HEAD_DIM,
    pad_token_id=0,
    bos_token_id=1,
    eos_token_id=2,
)
_NO_DROPOUT = dict(
    attention_dropout=0.0,
    dropout=0.0,
    activation_dropout=0.0,
    hidden_dropout_prob=0.0,
    attention_probs_dropout_prob=0.0,
    resid_pdrop=0.0,
    embd_pdrop=0.0,
    attn_pdrop=0.0,
    dropout_rate=0.0,
    hidden_dropout=0.0,
    classifier_dropout=0.0,
)


@dataclasses.dataclass(frozen=True)
class Architecture:
    """How to build one tiny model and its inputs.

    ``task`` picks the Auto class and the inputs: ``causal-lm``, ``masked-lm``, ``seq2seq``,
    ``speech-seq2seq``, ``image-classification`` or ``contrastive`` (CLIP).
    """

    model_type: str
    task: str
    config: dict

    @property
    def generates(self) -> bool:
        return self.task in ("causal-lm", "seq2seq", "speech-seq2seq")


def _causal(model_type: str, **overrides: Any) -> Architecture:
    return Architecture(model_type, "causal-lm", {**_DECODER, **overrides})


ARCHITECTURES: dict[str, Architecture] = {
    a.model_type: a
    for a in [
        _causal("llama"),
        _causal("qwen2"),
        _causal("qwen3"),
        _causal(
            "qwen3_moe", num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, decoder_sparse_step=1
        ),
        _causal("mistral", sliding_window=None),
        _causal("mixtral", num_local_experts=4, num_experts_per_tok=2),
        _causal("gemma"),
        _causal(
            "gemma2",
            query_pre_attn_scalar=_HEAD_DIM,
            sliding_window=4,
            final_logit_softcapping=30.0,
            attn_logit_softcapping=50.0,
        ),
        _causal("gemma3_text", query_pre_attn_scalar=_HEAD_DIM, sliding_window=4, sliding_window_pattern=2),
        _causal("phi3"),
        _causal("gpt2", n_embd=_HIDDEN, n_layer=_LAYERS, n_head=_HEADS, n_positions=64, n_inner=_FFN),
        _causal("gpt_neox", rotary_pct=0.5),
        _causal(
            "deepseek_v3",
            n_routed_experts=4,
            n_shared_experts=1,
            num_experts_per_tok=2,
            moe_intermediate_size=32,
            first_k_dense_replace=1,
            n_group=2,
            topk_group=1,
            kv_lora_rank=16,
            q_lora_rank=24,
            qk_rope_head_dim=4,
            qk_nope_head_dim=4,
            v_head_dim=8,
            head_dim=4,
            rope_interleave=True,
            # multi-head latent attention gives every head its own keys and values, as
            # DeepSeek-V3's own config says (fewer would make Transformers repeat them again
            # under torch.compile)
            num_key_value_heads=_HEADS,
        ),
        Architecture("bert", "masked-lm", dict(_DECODER, max_position_embeddings=64)),
        Architecture(
            "roberta", "masked-lm", dict(_DECODER, max_position_embeddings=64, pad_token_id=1, bos_token_id=0)
        ),
        Architecture(
            "t5",
            "seq2seq",
            dict(
                vocab_size=_VOCAB,
                d_model=_HIDDEN,
                d_ff=_FFN,
                d_kv=_HEAD_DIM,
                num_layers=_LAYERS,
                num_heads=_HEADS,
                decoder_start_token_id=0,
                pad_token_id=0,
                eos_token_id=1,
            ),
        ),
        Architecture(
            "bart",
            "seq2seq",
            dict(
                vocab_size=_VOCAB,
                d_model=_HIDDEN,
                encoder_layers=_LAYERS,
                decoder_layers=_LAYERS,
                encoder_attention_heads=_HEADS,
                decoder_attention_heads=_HEADS,
                encoder_ffn_dim=_FFN,
                decoder_ffn_dim=_FFN,
                max_position_embeddings=64,
                pad_token_id=1,
                bos_token_id=0,
                eos_token_id=2,
                decoder_start_token_id=2,
                forced_eos_token_id=None,
            ),
        ),
        Architecture(
            "whisper",
            "speech-seq2seq",
            dict(
                vocab_size=_VOCAB,
                d_model=_HIDDEN,
                encoder_layers=_LAYERS,
                decoder_layers=_LAYERS,
                encoder_attention_heads=_HEADS,
                decoder_attention_heads=_HEADS,
                encoder_ffn_dim=_FFN,
                decoder_ffn_dim=_FFN,
                num_mel_bins=16,
                max_source_positions=16,
                max_target_positions=64,
                pad_token_id=0,
                bos_token_id=1,
                eos_token_id=2,
                decoder_start_token_id=1,
                suppress_tokens=None,
                begin_suppress_tokens=None,
            ),
        ),
        Architecture(
            "clip",
            "contrastive",
            dict(
                text_config=dict(
                    vocab_size=_VOCAB,
                    hidden_size=_HIDDEN,
                    intermediate_size=_FFN,
                    num_hidden_layers=_LAYERS,
                    num_attention_heads=_HEADS,
                    max_position_embeddings=64,
                    projection_dim=16,
                ),
                vision_config=dict(
                    hidden_size=_HIDDEN,
                    intermediate_size=_FFN,
                    num_hidden_layers=_LAYERS,
                    num_attention_heads=_HEADS,
                    image_size=32,
                    patch_size=8,
                    projection_dim=16,
                ),
                projection_dim=16,
            ),
        ),
        Architecture(
            "vit",
            "image-classification",
            dict(
                hidden_size=_HIDDEN,
                intermediate_size=_FFN,
                num_hidden_layers=_LAYERS,
                num_attention_heads=_HEADS,
                image_size=32,
                patch_size=8,
                num_labels=10,
            ),
        ),
    ]
}


def build(model_type: str, seed: int = 0, **config_overrides: Any) -> torch.nn.Module:
    """The tiny model for ``model_type`` on CPU, in eval mode, weights drawn from ``seed``."""
    import transformers

    arch = ARCHITECTURES[model_type]
    fields = {**arch.config, **config_overrides}
    config = transformers.AutoConfig.for_model(model_type, **fields)
    for name, value in _NO_DROPOUT.items():
        for sub in (config, getattr(config, "text_config", None), getattr(config, "vision_config", None)):
            if sub is not None and hasattr(sub, name):
                setattr(sub, name, value)
    auto = {
        "causal-lm": transformers.AutoModelForCausalLM,
        "masked-lm": transformers.AutoModelForMaskedLM,
        "seq2seq": transformers.AutoModelForSeq2SeqLM,
        "speech-seq2seq": transformers.AutoModelForSpeechSeq2Seq,
        "image-classification": transformers.AutoModelForImageClassification,
        "contrastive": transformers.AutoModel,
    }[arch.task]
    torch.manual_seed(seed)
    return auto.from_config(config).eval()


def inputs(
    model_type: str, batch: int = 2, seq: int = 8, seed: int = 1, with_labels: bool = False
) -> dict[str, torch.Tensor]:
    """Model inputs on CPU (``labels`` too when ``with_labels``), drawn from ``seed``."""
    arch = ARCHITECTURES[model_type]
    gen = torch.Generator().manual_seed(seed)
    # Token ids start at 3 so no sample hits pad/bos/eos by chance.
    tokens = lambda n: torch.randint(3, _VOCAB, (batch, n), generator=gen)  # noqa: E731
    if arch.task in ("causal-lm", "masked-lm"):
        ids = tokens(seq)
        feed = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
        if with_labels:
            feed["labels"] = ids.clone()
    elif arch.task == "seq2seq":
        ids = tokens(seq)
        feed = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
        feed["labels" if with_labels else "decoder_input_ids"] = tokens(seq // 2)
    elif arch.task == "speech-seq2seq":
        frames = 2 * arch.config["max_source_positions"]
        feed = {"input_features": torch.randn(batch, arch.config["num_mel_bins"], frames, generator=gen)}
        feed["labels" if with_labels else "decoder_input_ids"] = tokens(seq // 2)
    elif arch.task == "image-classification":
        feed = {"pixel_values": torch.randn(batch, 3, 32, 32, generator=gen)}
        if with_labels:
            feed["labels"] = torch.randint(0, 10, (batch,), generator=gen)
    else:  # contrastive
        ids = tokens(seq)
        feed = {
            "input_ids": ids,
            "attention_mask": torch.ones_like(ids),
            "pixel_values": torch.randn(batch, 3, 32, 32, generator=gen),
        }
        if with_labels:
            feed["return_loss"] = True
    return feed


@dataclasses.dataclass
class Comparison:
    """tpu vs CPU for one architecture. ``*_rel`` are max abs differences divided by the CPU
    value's scale (its max abs). ``grad_rel`` is the worst over all parameters, each scaled by
    the larger of its own gradient's scale and a thousandth of the largest gradient's (some true
    gradients are zero, a key projection's bias for one, and their rounding noise has no scale of
    its own). ``next_loss_rel`` compares the loss after one AdamW step."""

    model_type: str
    forward_rel: float
    generate_equal: bool | None
    loss_rel: float
    grad_rel: float
    next_loss_rel: float
    worst_grad: str = ""
    compiled_forward_rel: float | None = None  # torch.compile(backend=device), when measured


def _on(feed: dict, device: str) -> dict:
    return {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in feed.items()}


def _primary_output(out: Any) -> torch.Tensor:
    for name in ("logits", "logits_per_image", "last_hidden_state"):
        value = getattr(out, name, None)
        if value is not None:
            return value
    raise TypeError(f"no primary output in {type(out).__name__}")


def _scale(t: torch.Tensor) -> float:
    return float(t.detach().abs().max()) if t.numel() else 0.0


def _rel(actual: torch.Tensor, expected: torch.Tensor, scale: float | None = None) -> float:
    diff = (actual.detach().cpu().double() - expected.detach().double()).abs().max()
    return float(diff) / max(_scale(expected) if scale is None else scale, 1e-12)


def _train_step(model: torch.nn.Module, feed: dict) -> tuple[torch.Tensor, dict, torch.Tensor]:
    """Loss, gradients, then one AdamW step and the loss after it."""
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    loss = model(**feed).loss
    loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    opt.step()
    with torch.no_grad():
        next_loss = model(**feed).loss
    return loss.detach(), grads, next_loss


def _greedy(model: torch.nn.Module, feed: dict, new_tokens: int) -> torch.Tensor:
    feed = {k: v for k, v in feed.items() if k != "decoder_input_ids"}
    return model.generate(
        **feed, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False, num_beams=1
    )


def compare(model_type: str, device: str = "tpu", generate_tokens: int = 16) -> Comparison:
    """Run ``model_type`` on CPU and on ``device`` from the same weights and inputs."""
    cpu_model = build(model_type)
    dev_model = copy.deepcopy(cpu_model).to(device)
    feed = inputs(model_type)
    with torch.no_grad():
        forward = _rel(_primary_output(dev_model(**_on(feed, device))), _primary_output(cpu_model(**feed)))
        generated = None
        if ARCHITECTURES[model_type].generates and generate_tokens:
            expected = _greedy(cpu_model, feed, generate_tokens)
            generated = torch.equal(_greedy(dev_model, _on(feed, device), generate_tokens).cpu(), expected)
    labelled = inputs(model_type, with_labels=True)
    cpu_loss, cpu_grads, cpu_next = _train_step(cpu_model, labelled)
    dev_loss, dev_grads, dev_next = _train_step(dev_model, _on(labelled, device))
    if cpu_grads.keys() != dev_grads.keys():
        raise AssertionError(
            f"{model_type}: parameters with gradients differ: {sorted(cpu_grads.keys() ^ dev_grads.keys())}"
        )
    floor = 1e-3 * max(_scale(g) for g in cpu_grads.values())
    grad_rel = {n: _rel(dev_grads[n], g, max(_scale(g), floor)) for n, g in cpu_grads.items()}
    worst = max(grad_rel, key=grad_rel.get)
    return Comparison(
        model_type,
        forward,
        generated,
        _rel(dev_loss, cpu_loss),
        grad_rel[worst],
        _rel(dev_next, cpu_next),
        worst,
    )


def compiled_forward(model_type: str, device: str = "tpu") -> float:
    """The ``torch.compile(model, backend=device)`` forward on ``device`` against CPU eager, from
    the same weights and inputs (relative difference, as in :class:`Comparison`)."""
    torch._dynamo.reset()
    cpu_model = build(model_type)
    compiled = torch.compile(copy.deepcopy(cpu_model).to(device), backend=device)
    feed = inputs(model_type)
    with torch.no_grad():
        return _rel(_primary_output(compiled(**_on(feed, device))), _primary_output(cpu_model(**feed)))


def markdown(results: list[Comparison]) -> str:
    """``docs/models.md``'s table for ``results``."""
    rows = [
        "| model | forward | greedy generate (16 tokens) | loss | worst gradient | "
        "loss after AdamW step | compiled forward |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in results:
        gen = {None: "n/a (no decoder)", True: "identical ids", False: "**differs**"}
        compiled = "-" if r.compiled_forward_rel is None else f"{r.compiled_forward_rel:.1e}"
        rows.append(
            f"| {r.model_type} | {r.forward_rel:.1e} | {gen[r.generate_equal]} | "
            f"{r.loss_rel:.1e} | {r.grad_rel:.1e} | {r.next_loss_rel:.1e} | "
            f"{compiled} |"
        )
    return "\n".join(rows) + "\n"


def main(argv: list[str] | None = None) -> None:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("models", nargs="*", default=list(ARCHITECTURES))
    args = parser.parse_args(argv)
    import torch_tpu  # noqa: F401

    results = []
    for name in args.models:
        results.append(dataclasses.replace(compare(name), compiled_forward_rel=compiled_forward(name)))
        print(results[-1], flush=True)
    print(markdown(results))


if __name__ == "__main__":
    main()
