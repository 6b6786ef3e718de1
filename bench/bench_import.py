"""What installing torch_tpu costs a process that imports torch, measured side by side.

Each contender is a fresh ``python -c`` process, timed from start to exit; rounds interleave the
contenders so machine noise hits them alike, and the table shows medians:

- **import torch, autoload off**: ``TORCH_DEVICE_BACKEND_AUTOLOAD=0``, PyTorch alone;
- **import torch**: PyTorch's backend autoload registers tpu (the cost every torch user of this
  environment pays; the target is under 0.3 s added, with JAX left unimported);
- **import jax**: raw JAX, for scale (what the first tpu op adds later);
- **first tpu op**: ``import torch`` and ``torch.ones(1, device="tpu").sum().item()``, which
  starts the device (JAX, XLA's client) and compiles or loads two executables.

Usage::

    python bench/bench_import.py               # 7 rounds
    python bench/bench_import.py --rounds 3    # quicker
    python bench/bench_import.py --markdown    # the table as Markdown, for the docs
    python bench/bench_import.py --write-docs  # and into docs/benchmarks.md
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

import _docs

CONTENDERS = {
    "import torch, autoload off": ("import torch", {"TORCH_DEVICE_BACKEND_AUTOLOAD": "0"}),
    "import torch": ("import torch, sys; assert 'jax' not in sys.modules", {}),
    "import jax": ("import jax", {}),
    "first tpu op": ("import torch; torch.ones(1, device='tpu').sum().item()", {}),
}
BASELINE = "import torch, autoload off"


def seconds(code: str, env: dict[str, str]) -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], env={**os.environ, **env}, check=True)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--markdown", action="store_true")
    _docs.add_flag(parser)
    args = parser.parse_args()
    print(f"load average: {os.getloadavg()[0]:.2f}", file=sys.stderr)
    for code, env in CONTENDERS.values():  # warm the file system cache
        seconds(code, env)
    times: dict[str, list[float]] = {name: [] for name in CONTENDERS}
    for _ in range(args.rounds):
        for name, (code, env) in CONTENDERS.items():
            times[name].append(seconds(code, env))
    base = statistics.median(times[BASELINE])
    rows = [(name, statistics.median(t), statistics.median(t) - base) for name, t in times.items()]
    with _docs.section("import", args):
        print_table(rows, args.markdown)


def print_table(rows: list[tuple[str, float, float]], markdown: bool) -> None:
    if markdown:
        print("| process | median seconds | added to `import torch` alone |\n|---|---|---|")
        for name, median, added in rows:
            print(f"| {name} | {median:.2f} | {added:+.2f} |")
    else:
        print(f"{'process':<28}{'median s':>10}{'added s':>10}")
        for name, median, added in rows:
            print(f"{name:<28}{median:>10.2f}{added:>+10.2f}")


if __name__ == "__main__":
    main()
