"""vLLM serving throughput on tpu next to vLLM's own CPU backend, on the same tiny local Llama.

Each backend runs in a child process of its own (vLLM picks one platform per process: the tpu
plugin, or its CPU platform with ``VLLM_TARGET_DEVICE=cpu``), with vLLM's engine in that process.
For 1, 8 and 32 concurrent requests (one ``generate()`` call of that many prompts, which vLLM's
scheduler batches as it would as many concurrent clients), it reports:

- **tokens/s**: generated tokens per second, ``NEW_TOKENS`` per request (end-of-text ignored),
  the median of ``--rounds`` warm runs (the first run compiles tpu's shapes and is not counted);
- **TTFT**: time to first token, a ``max_tokens=1`` call of the same batch (prefill + one
  sampled token), median of warm runs.

Machine load distorts both sides (CPU attention kernels use every core); check the load average
printed first. Usage::

    python bench/bench_serve.py            # the table
    python bench/bench_serve.py --quick    # 1 round, concurrency 1 and 8
    python bench/bench_serve.py --markdown
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

PROMPT_TOKENS, NEW_TOKENS = 16, 32
CONCURRENCY = (1, 8, 32)


def measure(model: str, concurrency: tuple[int, ...], rounds: int) -> dict:
    """In the child: this process's backend, every concurrency level."""
    import vllm
    from vllm.platforms import current_platform

    llm = vllm.LLM(
        model=model,
        dtype="float32",
        enforce_eager=True,
        max_model_len=256,
        max_num_seqs=max(concurrency),
        kv_cache_memory_bytes=64 << 20,
        enable_prefix_caching=False,  # every run prefills its prompts (the runs repeat them)
        seed=0,
    )
    results = {"device": current_platform.get_device_name(), "rows": {}}
    for n in concurrency:
        # Distinct prompts of one length, so the rows compare batch sizes and nothing else.
        prompts = [
            {"prompt_token_ids": [3 + (i * 7 + j) % 400 for j in range(PROMPT_TOKENS)]} for i in range(n)
        ]

        def run(max_tokens: int) -> float:
            params = vllm.SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
            start = time.perf_counter()
            outputs = llm.generate(prompts, params, use_tqdm=False)
            elapsed = time.perf_counter() - start
            assert all(len(o.outputs[0].token_ids) == max_tokens for o in outputs)
            return elapsed

        run(NEW_TOKENS)  # compiles (tpu) and warms caches
        generate = statistics.median(run(NEW_TOKENS) for _ in range(rounds))
        first = statistics.median(run(1) for _ in range(rounds))
        results["rows"][n] = {"tokens_per_s": n * NEW_TOKENS / generate, "ttft_ms": 1000 * first}
    return results


def child(backend: str, model: str, concurrency: tuple[int, ...], rounds: int, plugin: str | None) -> dict:
    env = dict(os.environ, VLLM_ENABLE_V1_MULTIPROCESSING="0")
    if backend == "cpu":
        env["VLLM_TARGET_DEVICE"] = "cpu"  # vLLM's CPU platform, whatever plugins are installed
    env["PYTHONPATH"] = os.pathsep.join(filter(None, (plugin, *sys.path)))
    command = [sys.executable, __file__, "--child", model, "--concurrency", *map(str, concurrency)]
    command += ["--rounds", str(rounds)]
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"{backend} run failed:\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--markdown", action="store_true")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--concurrency", type=int, nargs="+", default=list(CONCURRENCY))
    parser.add_argument("--child", metavar="MODEL", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(measure(args.child, tuple(args.concurrency), args.rounds)))
        return

    from torch_tpu.testing import tiny_llama, vllm_plugin

    concurrency = (1, 8) if args.quick else tuple(args.concurrency)
    rounds = 1 if args.quick else args.rounds
    with tempfile.TemporaryDirectory() as tmp:
        model = tiny_llama.build(os.path.join(tmp, "tiny-llama"))
        plugin = vllm_plugin.declare(os.path.join(tmp, "entry_point"))
        print(
            f"load average {os.getloadavg()[0]:.2f}; {PROMPT_TOKENS}-token prompts, {NEW_TOKENS} new tokens"
        )
        results = {backend: child(backend, model, concurrency, rounds, plugin) for backend in ("tpu", "cpu")}

    header = ["concurrent", "tpu tok/s", "cpu tok/s", "tpu/cpu", "tpu TTFT ms", "cpu TTFT ms"]
    rows = []
    for n in concurrency:
        tpu, cpu = (results[b]["rows"][str(n)] for b in ("tpu", "cpu"))
        rows.append(
            [
                str(n),
                f"{tpu['tokens_per_s']:.0f}",
                f"{cpu['tokens_per_s']:.0f}",
                f"{tpu['tokens_per_s'] / cpu['tokens_per_s']:.2f}",
                f"{tpu['ttft_ms']:.0f}",
                f"{cpu['ttft_ms']:.0f}",
            ]
        )
    print(f"tpu: {results['tpu']['device']}; cpu: vLLM's CPU backend")
    if args.markdown:
        print("| " + " | ".join(header) + " |")
        print("|" + "---|" * len(header))
        for row in rows:
            print("| " + " | ".join(row) + " |")
    else:
        print("  ".join(f"{h:>12}" for h in header))
        for row in rows:
            print("  ".join(f"{c:>12}" for c in row))


if __name__ == "__main__":
    main()
