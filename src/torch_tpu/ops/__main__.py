"""``python -m torch_tpu.ops``: the natively lowered ATen overloads, counted by family and listed.

``--markdown`` prints docs/ops.md instead (``python -m torch_tpu.ops --markdown > docs/ops.md``).
The probe behind ``ops/_cpu_refusals.py`` is a developer tool: ``tools/regenerate_cpu_refusals.py``.
"""

from __future__ import annotations

import argparse

import torch

from torch_tpu.ops._coverage import render_markdown, render_text


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m torch_tpu.ops", description=__doc__)
    parser.add_argument("--markdown", action="store_true", help="print docs/ops.md")
    args = parser.parse_args()
    torch.tpu.init()  # fills the op table
    print(render_markdown() if args.markdown else render_text(), end="" if args.markdown else "\n")


if __name__ == "__main__":
    main()
