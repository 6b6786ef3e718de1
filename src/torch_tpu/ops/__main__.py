"""``python -m torch_tpu.ops``: the natively lowered ATen overloads, counted by family and listed.

``--markdown`` prints docs/ops.md instead (``python -m torch_tpu.ops --markdown > docs/ops.md``);
``--regenerate-cpu-dtypes`` reruns the probe behind ``ops/_cpu_refusals.py`` (``ops.cpu_dtypes``).
"""

from __future__ import annotations

import argparse

import torch

import torch_tpu  # noqa: F401  (registers the device)
from torch_tpu.ops import cpu_dtypes
from torch_tpu.ops._coverage import render_markdown, render_text


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m torch_tpu.ops", description=__doc__)
    parser.add_argument("--markdown", action="store_true", help="print docs/ops.md")
    parser.add_argument("--regenerate-cpu-dtypes", action="store_true", help="rewrite ops/_cpu_refusals.py")
    args = parser.parse_args()
    torch.tpu.init()  # fills the op table
    if args.regenerate_cpu_dtypes:
        cpu_dtypes.regenerate()
        return
    print(render_markdown() if args.markdown else render_text(), end="" if args.markdown else "\n")


if __name__ == "__main__":
    main()
