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


STEPS = 4


#: TorchTitan's float8 converter (torchao's ``Float8Linear``, tensor-wise scales). TorchTitan
#: 0.2.2 allows it off CUDA SM89 only as ``emulate``: operands cast to float8 as on hardware, the
#: matmul of the dequantized values in float32.
FLOAT8 = {"model": {"converters": ["quantize.linear.float8"]}, "quantize.linear.float8": {"emulate": True}}


#: 4-rank layouts over a 2-D mesh: FSDP x tensor parallelism, and FSDP x pipeline parallelism
#: (TorchTitan's default schedule, 1F1B, over 2 stages); each rank's batch as in the FSDP run, so
#: every layout trains on the same global batch.
LAYOUTS = {
    "tp": {"data_parallel_shard_degree": 2, "tensor_parallel_degree": 2},
    "pp": {"data_parallel_shard_degree": 2, "pipeline_parallel_degree": 2},
}


def ranks(run: str) -> int:
    """The processes job ``run`` takes."""
    if run == "seed":
        return 1
    return 4 if run.endswith(tuple(f"_{layout}" for layout in LAYOUTS)) else 2


def jobs(folder: Path) -> dict[str, Path]:
    """The tokenizer and dataset under ``folder``, and the jobs' tomls: ``seed`` (one process
    writes the initial weights: TorchTitan's seed checkpoint, so that all runs start from the
    same weights, which tpu's and CPU's random generators would not draw alike), then ``cpu``
    and ``tpu``: the llama3 debugmodel, FSDP over 2 ranks (``dp_shard=2``), float32 throughout,
    ``STEPS`` AdamW steps of 2 x 64 tokens per rank, no compile, no activation checkpointing,
    the seed loaded and nothing saved, metrics to TensorBoard every step; ``cpu_float8`` and
    ``tpu_float8``: the same with :data:`FLOAT8`; ``{cpu,tpu}_{tp,pp}``: the :data:`LAYOUTS`."""
    tokenizer, data = build_tokenizer(folder / "tokenizer"), build_dataset(folder / "data")
    common = {
        "metrics": {"log_freq": 1, "enable_tensorboard": True, "disable_color_printing": True},
        "model": {"name": "llama3", "flavor": "debugmodel", "hf_assets_path": str(tokenizer)},
        "optimizer": {"name": "AdamW", "lr": 8e-4},
        "lr_scheduler": {"warmup_steps": 2},
        "training": {
            "local_batch_size": 2,
            "seq_len": 64,
            "steps": STEPS,
            "dataset": "c4_test",
            "dataset_path": str(data),
            "mixed_precision_param": "float32",
        },
        "parallelism": {"data_parallel_shard_degree": 2},
        "activation_checkpoint": {"mode": "none"},
        "compile": {"enable": False},
        "debug": {"seed": 0},
    }
    seed = folder / "seed"
    configs = {"seed": {"parallelism": {"data_parallel_shard_degree": 1}}}
    configs["seed"]["checkpoint"] = {"enable": True, "create_seed_checkpoint": True}
    load = {"enable": True, "initial_load_path": str(seed / "checkpoint" / "step-0"), "load_only": True}
    for run in ("cpu", "tpu"):
        configs[run] = {"checkpoint": load}
        configs[f"{run}_float8"] = {"checkpoint": load, **FLOAT8}
        for layout, parallelism in LAYOUTS.items():
            configs[f"{run}_{layout}"] = {"checkpoint": load, "parallelism": parallelism}
    paths = {}
    for run, overrides in configs.items():
        sections = {"job": {"dump_folder": str(folder / run)}}
        sections |= {k: {**v, **overrides.get(k, {})} for k, v in common.items()}
        sections |= {k: v for k, v in overrides.items() if k not in common}
        paths[run] = write_config(folder / f"{run}.toml", sections)
    return paths


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
