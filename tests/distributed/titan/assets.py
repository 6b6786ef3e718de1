"""What a TorchTitan run needs and its wheel does not ship, built from ``corpus.txt``: a BPE
tokenizer in the Hugging Face layout TorchTitan's ``build_hf_tokenizer`` loads
(``tokenizer.json`` + ``tokenizer_config.json``), the corpus as a local json dataset its
``c4_test`` loader reads (``load_dataset(path, split="train")``, a ``text`` field per sample),
and the job's toml. Read TorchTitan's metrics back from its TensorBoard events."""

from __future__ import annotations

import json
from pathlib import Path

CORPUS = Path(__file__).resolve().parent / "corpus.txt"
BOS, EOS = "<|begin_of_text|>", "<|end_of_text|>"
VOCAB = 512  # below the debugmodel's 2048 embeddings; the corpus is a few KB


def build_tokenizer(folder: Path) -> Path:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB,
        special_tokens=[BOS, EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train([str(CORPUS)], trainer)
    folder.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({"bos_token": BOS, "eos_token": EOS}))
    return folder


def build_dataset(folder: Path) -> Path:
    """One sample per paragraph (TorchTitan packs the samples' tokens into ``seq_len + 1`` rows
    and re-loops the data when it runs out)."""
    folder.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps({"text": p}) for p in CORPUS.read_text().splitlines() if p.strip()]
    (folder / "train.json").write_text("\n".join(lines) + "\n")
    return folder


def _toml_value(value) -> str:
    return json.dumps(value) if not isinstance(value, bool) else str(value).lower()


def write_config(path: Path, sections: dict[str, dict]) -> Path:
    """A TorchTitan job toml (``--job.config_file``) from ``{section: {key: value}}``."""
    text = "".join(
        f"[{name}]\n" + "".join(f"{key} = {_toml_value(v)}\n" for key, v in values.items()) + "\n"
        for name, values in sections.items()
    )
    path.write_text(text)
    return path


def scalars(folder: Path, tag: str) -> list[float]:
    """The values of ``tag``, by step, in the TensorBoard events under ``folder`` (TorchTitan's
    ``--metrics.enable_tensorboard``: exact float32, where its console log rounds the loss)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    (events,) = {p.parent for p in folder.rglob("events.out.tfevents.*")}
    accumulator = EventAccumulator(str(events), size_guidance={"scalars": 0})
    accumulator.Reload()
    return [event.value for event in sorted(accumulator.Scalars(tag), key=lambda e: e.step)]
