"""Write a benchmark's Markdown output into its section of docs/benchmarks.md.

Each bench script that prints ``--markdown`` also takes ``--write-docs``: the script runs as with
``--markdown``, prints as usual, and what it printed replaces the lines between
``<!-- bench:NAME -->`` and ``<!-- /bench:NAME -->`` in docs/benchmarks.md, after a stamp line
(commit, date, machine, JAX backend) and the command that regenerates it. Nothing else in the
page changes. Usage in a script::

    _docs.add_flag(parser)
    args = parser.parse_args()
    with _docs.section("import", args):  # sets args.markdown when writing
        print(table)
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import io
import os
import platform
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "benchmarks.md"


def add_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--write-docs",
        action="store_true",
        help="print Markdown and write it into this script's section of docs/benchmarks.md",
    )


def _commit() -> str:
    try:
        out = subprocess.run(
            ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            # (the page itself is left out: writing one section must not mark the next as dirty)
            ["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no", "--", ".", ":!docs"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown commit"
    return out + (" with local changes" if dirty else "")


def _backend() -> str:
    try:
        import jax

        return jax.default_backend()
    except Exception as error:  # a stamp must not lose the measured table
        return f"unknown ({type(error).__name__})"


def stamp(
    command: str, *, commit: str | None = None, today: str | None = None, backend: str | None = None
) -> str:
    """The line put above a regenerated table: where and when it was measured, and how."""
    commit = commit or _commit()
    today = today or datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d")
    backend = backend or _backend()
    machine = f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs"
    machine += f" (load average {os.getloadavg()[0]:.1f})"
    return (
        f"Measured at `{commit}` on {today}, {machine}, JAX backend `{backend}`; regenerate with `{command}`."
    )


def replace_section(text: str, name: str, body: str) -> str:
    """``text`` with the lines between NAME's two markers replaced by ``body``; a page without
    exactly one such section is refused (a typo must not append a stray table)."""
    start, end = f"<!-- bench:{name} -->", f"<!-- /bench:{name} -->"
    pattern = re.compile(re.escape(start) + r"\n.*?" + re.escape(end), re.DOTALL)
    found = pattern.findall(text)
    if len(found) != 1:
        raise ValueError(
            f"docs/benchmarks.md needs exactly one {start} ... {end} section, found {len(found)}"
        )
    return pattern.sub(lambda _: f"{start}\n{body.strip()}\n{end}", text)


def write(name: str, markdown: str, command: str, page: Path | None = None, **stamp_fields: str) -> None:
    page = page or PAGE
    body = stamp(command, **stamp_fields) + "\n\n" + markdown.strip()
    page.write_text(replace_section(page.read_text(), name, body))


class _Tee(io.TextIOBase):
    def __init__(self, out):
        self.out, self.seen = out, io.StringIO()

    def write(self, text: str) -> int:
        self.seen.write(text)
        return self.out.write(text)

    def flush(self) -> None:
        self.out.flush()


def command_line() -> str:
    script = os.path.relpath(os.path.abspath(sys.argv[0]), ROOT)
    return " ".join(["python", script, *sys.argv[1:]])


@contextlib.contextmanager
def section(name: str, args: argparse.Namespace, attribute: str = "markdown") -> Iterator[None]:
    """Print as usual inside; with ``--write-docs``, print Markdown and write what was printed into
    section NAME. Lines a script prints outside the block (progress, load average) stay out."""
    writing = getattr(args, "write_docs", False)
    if writing:
        setattr(args, attribute, True)
    if not writing:
        yield
        return
    tee = _Tee(sys.stdout)
    with contextlib.redirect_stdout(tee):
        yield
    write(name, tee.seen.getvalue(), command_line())
    print(f"wrote the {name} section of {os.path.relpath(PAGE)}", file=sys.stderr)
