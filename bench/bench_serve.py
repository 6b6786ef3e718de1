"""vLLM serving throughput on tpu next to vLLM's own CPU backend, on the same tiny local Llama.

Each backend runs in a child process of its own (vLLM picks one platform per process: the tpu
plugin, or its CPU platform with ``VLLM_TARGET_DEVICE=cpu``), with vLLM's engine in that process,
once at vLLM's defaults (the model compiled) and once with ``enforce_eager=True``. For 1, 8, 32
and 128 concurrent requests (one ``generate()`` call of that many prompts, which vLLM's
scheduler batches as it would as many concurrent clients), it reports:

- **tokens/s**: generated tokens per second, ``NEW_TOKENS`` per request (end-of-text ignored),
  the median of ``--rounds`` warm runs (the first run compiles tpu's shapes and is not counted);
- **TTFT**: time to first token, a ``max_tokens=1`` call of the same batch (prefill + one
  sampled token), median of warm runs;
- **ITL**: inter-token latency, the rest of a request's time over its other tokens;
- **XLA ms/step** and **host ms/step** (tpu): XLA's execution time per step, every program
  waited for and timed in a pass of its own, and the rest of a step's wall time (the host's
  work: vLLM's scheduler and runner, torch_tpu's dispatch).

``--profile`` instead profiles the tpu child's warm decoding steps (cProfile, one request) and
prints where a step's host time goes. Machine load distorts both sides (CPU attention kernels
use every core); check the load average printed first. Usage::

    python bench/bench_serve.py            # the tables
    python bench/bench_serve.py --quick    # 1 round, concurrency 1 and 8, defaults only
    python bench/bench_serve.py --markdown
    python bench/bench_serve.py --profile
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

import _docs

PROMPT_TOKENS, NEW_TOKENS = 16, 32
CONCURRENCY = (1, 8, 32, 128)
#: the two configurations measured: vLLM's defaults (the model compiled), and eager
MODES = {"defaults": {}, "enforce_eager": {"enforce_eager": True}}


def _llm(model: str, mode: str, max_num_seqs: int):
    import vllm

    return vllm.LLM(
        model=model,
        dtype="float32",
        max_model_len=256,
        max_num_seqs=max_num_seqs,
        kv_cache_memory_bytes=64 << 20,
        enable_prefix_caching=False,  # every run prefills its prompts (the runs repeat them)
        seed=0,
        **MODES[mode],
    )


def _prompts(n: int) -> list[dict]:
    """Distinct prompts of one length, so the rows compare batch sizes and nothing else."""
    return [{"prompt_token_ids": [3 + (i * 7 + j) % 400 for j in range(PROMPT_TOKENS)]} for i in range(n)]


def _generate(llm, prompts: list, max_tokens: int) -> float:
    import vllm

    params = vllm.SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    start = time.perf_counter()
    outputs = llm.generate(prompts, params, use_tqdm=False)
    elapsed = time.perf_counter() - start
    assert all(len(o.outputs[0].token_ids) == max_tokens for o in outputs)
    return elapsed


def measure(model: str, mode: str, concurrency: tuple[int, ...], rounds: int) -> dict:
    """In the child: this process's backend, every concurrency level."""
    from vllm.platforms import current_platform

    llm = _llm(model, mode, max(concurrency))
    results = {"device": current_platform.get_device_name(), "rows": {}}
    for n in concurrency:
        prompts = _prompts(n)
        _generate(llm, prompts, NEW_TOKENS)  # compiles (tpu) and warms caches
        generate = statistics.median(_generate(llm, prompts, NEW_TOKENS) for _ in range(rounds))
        first = statistics.median(_generate(llm, prompts, 1) for _ in range(rounds))
        results["rows"][n] = {
            "tokens_per_s": n * NEW_TOKENS / generate,
            "ttft_ms": 1000 * first,
            "itl_ms": 1000 * max(generate - first, 0.0) / (NEW_TOKENS - 1),
        }
        if current_platform.device_type == "tpu":
            xla = _xla_seconds(llm, prompts)
            results["rows"][n]["xla_ms"] = 1000 * xla / NEW_TOKENS
            results["rows"][n]["host_ms"] = 1000 * max(generate - xla, 0.0) / NEW_TOKENS
    return results


def _xla_seconds(llm, prompts: list) -> float:
    """XLA's execution time in one ``generate()`` on tpu: every fused graph and replayed
    capture (the one place programs run, ``fused._execute``) waited for and timed. A pass of
    its own: the waits keep host and device work from overlapping. The prefill's compiled
    program (one step of ``NEW_TOKENS``) is not counted."""
    import jax

    from torch_tpu.execution import fused

    spent, execute = [0.0], fused._execute

    def timed(executable, leaves):
        start = time.perf_counter()
        values = jax.block_until_ready(execute(executable, leaves))
        spent[0] += time.perf_counter() - start
        return values

    fused._execute = timed
    try:
        _generate(llm, prompts, NEW_TOKENS)
    finally:
        fused._execute = execute
    return spent[0]


def profile(model: str, top: int = 25) -> None:
    """In the tpu child: cProfile of warm decoding steps of one request, per step."""
    import cProfile
    import pstats

    llm = _llm(model, "defaults", 1)
    prompts = _prompts(1)
    _generate(llm, prompts, NEW_TOKENS)
    profiler = cProfile.Profile()
    profiler.enable()
    elapsed = _generate(llm, prompts, NEW_TOKENS)
    profiler.disable()
    print(f"{1000 * elapsed / NEW_TOKENS:.1f} ms a step ({NEW_TOKENS} steps, profiled)")
    pstats.Stats(profiler).sort_stats("tottime").print_stats(top)


def child(backend: str, model: str, mode: str, options, plugin: str | None) -> dict:
    env = dict(os.environ, VLLM_ENABLE_V1_MULTIPROCESSING="0")
    if backend == "cpu":
        env["VLLM_TARGET_DEVICE"] = "cpu"  # vLLM's CPU platform, whatever plugins are installed
    env["PYTHONPATH"] = os.pathsep.join(filter(None, (plugin, *sys.path)))
    command = [sys.executable, __file__, "--child", model, "--mode", mode]
    command += ["--concurrency", *map(str, options.concurrency), "--rounds", str(options.rounds)]
    command += ["--profile"] if options.profile else []
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"{backend} run failed:\n{done.stderr[-4000:]}")
    if options.profile:
        return {"profile": done.stdout}
    return json.loads(done.stdout.strip().splitlines()[-1])


def _table(results: dict, concurrency: tuple[int, ...], markdown: bool) -> list[str]:
    header = ["concurrent", "tpu tok/s", "cpu tok/s", "tpu/cpu", "tpu TTFT ms", "cpu TTFT ms"]
    header += ["tpu ITL ms", "cpu ITL ms", "tpu XLA ms/step", "tpu host ms/step"]
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
                f"{tpu['itl_ms']:.1f}",
                f"{cpu['itl_ms']:.1f}",
                f"{tpu.get('xla_ms', float('nan')):.2f}",
                f"{tpu.get('host_ms', float('nan')):.2f}",
            ]
        )
    if markdown:
        return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)] + [
            "| " + " | ".join(row) + " |" for row in rows
        ]
    return ["  ".join(f"{h:>12}" for h in header)] + ["  ".join(f"{c:>12}" for c in row) for row in rows]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--markdown", action="store_true")
    _docs.add_flag(parser)
    parser.add_argument("--profile", action="store_true", help="profile tpu's decoding steps")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--concurrency", type=int, nargs="+", default=list(CONCURRENCY))
    parser.add_argument("--mode", choices=sorted(MODES), help="one configuration only")
    parser.add_argument("--child", metavar="MODEL", help=argparse.SUPPRESS)
    options = parser.parse_args()
    if options.child:
        if options.profile:
            profile(options.child)
        else:
            measured = measure(options.child, options.mode, tuple(options.concurrency), options.rounds)
            print(json.dumps(measured))
        return

    from torch_tpu.testing import tiny_llama, vllm_plugin

    if options.quick:
        options.concurrency, options.rounds, options.mode = [1, 8], 1, options.mode or "defaults"
    modes = [options.mode] if options.mode else list(MODES)
    with tempfile.TemporaryDirectory() as tmp:
        model = tiny_llama.build(os.path.join(tmp, "tiny-llama"))
        plugin = vllm_plugin.declare(os.path.join(tmp, "entry_point"))
        if options.profile:
            print(child("tpu", model, "defaults", options, plugin)["profile"])
            return
        load = os.getloadavg()[0]
        print(f"load average {load:.2f}; {PROMPT_TOKENS}-token prompts, {NEW_TOKENS} new tokens")
        with _docs.section("serve", options):
            for mode in modes:
                results = {
                    backend: child(backend, model, mode, options, plugin) for backend in ("tpu", "cpu")
                }
                print(f"\n{mode} (tpu: {results['tpu']['device']}; cpu: vLLM's CPU backend)\n")
                print("\n".join(_table(results, tuple(options.concurrency), options.markdown)))


if __name__ == "__main__":
    main()
