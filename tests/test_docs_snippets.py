"""Every ```python block in docs/*.md runs, unless a marker right before it says why not.

A page's blocks run in order in one fresh interpreter (``PYTHONPATH`` set to this checkout's
``src``), in one namespace, as a reader copies them top to bottom: a later block may use what an
earlier one defined. Blocks written as an interactive session (``>>>``) run as doctests, their
printed output checked. A block that cannot run here says so on the line before its fence:

    <!-- snippet: skip, needs vLLM's environment -->
    <!-- snippet: tested by tests/test_capture.py -->

A skipped block's reason is the skip message; "tested by" names the test that runs it (which must
read that page). A block with neither marker runs, and its failure fails its page.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
MARKER = re.compile(r"<!--\s*snippet:\s*(.*?)\s*-->")
TIMEOUT_S = 240  # a page's blocks together; the slowest page takes about a tenth of it


@dataclass(frozen=True)
class Block:
    page: str  # docs/NAME.md
    line: int  # the fence's line, 1-based
    code: str
    marker: str | None  # the marker's text after "snippet:", if any

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"

    def __str__(self) -> str:  # (test ids)
        return self.where


def blocks() -> list[Block]:
    found = []
    for path in sorted(DOCS.glob("*.md")):
        lines = path.read_text().split("\n")
        i = 0
        while i < len(lines):
            if lines[i].strip() != "```python":
                i += 1
                continue
            end = next(j for j in range(i + 1, len(lines)) if lines[j].strip() == "```")
            before = next((lines[j] for j in range(i - 1, -1, -1) if lines[j].strip()), "")
            match = MARKER.fullmatch(before.strip())
            page = f"docs/{path.name}"
            found.append(Block(page, i + 1, "\n".join(lines[i + 1 : end]) + "\n", match and match.group(1)))
            i = end + 1
    return found


BLOCKS = blocks()
PAGES = sorted({b.page for b in BLOCKS if b.marker is None})

# Runs in the fresh interpreter: the page's blocks, in order, in one namespace.
RUNNER = r"""
import doctest, json, sys
namespace = {"__name__": "__main__"}
for block in json.load(sys.stdin):
    print(f"--- {block['page']}:{block['line']}", flush=True)
    if block["code"].lstrip().startswith(">>>"):
        test = doctest.DocTestParser().get_doctest(
            block["code"], namespace, block["page"], block["page"], block["line"]
        )
        runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
        runner.run(test, clear_globs=False)
        namespace.update(test.globs)
        if runner.failures:
            sys.exit(f"{block['page']}:{block['line']}: the session's output differs (above)")
    else:
        exec(compile("\n" * block["line"] + block["code"], block["page"], "exec"), namespace)
print("--- all ran", flush=True)
"""


def test_the_docs_have_snippets_and_every_marker_is_known():
    assert len(BLOCKS) > 20
    for block in BLOCKS:
        if block.marker is not None:
            assert re.match(r"(skip, \S|tested by tests/\S+\.py$)", block.marker), (
                f"{block.where}: unknown marker {block.marker!r}: use "
                "'<!-- snippet: skip, REASON -->' or '<!-- snippet: tested by tests/FILE.py -->'"
            )


@pytest.mark.parametrize("page", PAGES)
def test_the_page_snippets_run(page, tmp_path):
    runnable = [b.__dict__ for b in BLOCKS if b.page == page and b.marker is None]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    env.pop("TORCH_TPU_REACHED_OPS_DIR", None)  # (the suite's op-coverage gate is this process's)
    done = subprocess.run(
        [sys.executable, "-c", RUNNER],
        input=json.dumps(runnable),
        capture_output=True,
        text=True,
        cwd=tmp_path,  # (a snippet that writes files writes them here)
        env=env,
        timeout=TIMEOUT_S,
    )
    ran = re.findall(r"^--- (docs/\S+)$", done.stdout, re.MULTILINE)
    failed = ran[-1] if ran else page
    assert done.returncode == 0 and done.stdout.endswith("--- all ran\n"), (
        f"the block at {failed} failed:\n{done.stdout[-3000:]}\n{done.stderr[-5000:]}"
    )


@pytest.mark.parametrize("block", [b for b in BLOCKS if b.marker and b.marker.startswith("skip")], ids=str)
def test_a_skipped_snippet_says_why(block):
    pytest.skip(f"{block.where}: {block.marker.removeprefix('skip, ')}")


@pytest.mark.parametrize(
    "block", [b for b in BLOCKS if b.marker and b.marker.startswith("tested by")], ids=str
)
def test_a_snippet_tested_elsewhere_is_read_by_that_test(block):
    test = ROOT / block.marker.removeprefix("tested by ")
    assert test.is_file(), f"{block.where}: {test} does not exist"
    assert Path(block.page).name in test.read_text(), f"{block.where}: {test.name} does not read {block.page}"


def test_the_contributing_example_is_the_registered_lowering():
    """docs/contributing.md's worked examples are module code (registering them again would
    duplicate their entries): each must be, line for line, what its module registers."""
    page = (DOCS / "contributing.md").read_text()
    examples = [b for b in BLOCKS if b.page == "docs/contributing.md"]
    assert examples
    for block in examples:
        named = re.findall(r"\(`(ops/\w+\.py)`\)", page[: page.index(block.code)])
        assert named, f"{block.where}: say which module registers the example, as (`ops/NAME.py`)"
        source = (ROOT / "src" / "torch_tpu" / named[-1]).read_text()
        assert block.code in source, f"{block.where}: the example differs from {named[-1]}"
