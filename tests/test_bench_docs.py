"""bench/_docs.py: a script's ``--write-docs`` replaces its own section of docs/benchmarks.md, stamped."""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
import _docs  # noqa: E402

PAGE = """# Benchmarks

<!-- bench:import -->
old import table
<!-- /bench:import -->

Prose between sections stays.

<!-- bench:eager -->
| case | time |
|---|---|
| add | 7.8 us |
<!-- /bench:eager -->
"""


def test_write_replaces_only_its_section_and_stamps_it(tmp_path):
    page = tmp_path / "benchmarks.md"
    page.write_text(PAGE)
    table = "| process | median seconds |\n|---|---|\n| import torch | 1.19 |\n"
    _docs.write(
        "import",
        table,
        "python bench/bench_import.py --write-docs",
        page,
        commit="abc1234",
        today="2026-12-07",
    )
    text = page.read_text()
    section = text.split("<!-- bench:import -->\n", 1)[1].split("<!-- /bench:import -->", 1)[0]
    stamp, blank, *rows = section.splitlines()
    assert stamp.startswith("Measured at `abc1234` on 2026-12-07, ")
    assert re.search(r", \d+ CPUs \(load average [\d.]+\), JAX backend `\w+`; ", stamp)
    assert stamp.endswith("regenerate with `python bench/bench_import.py --write-docs`.")
    assert blank == "" and rows == table.strip().splitlines()
    assert "old import table" not in text
    # everything outside the section is byte for byte the same
    assert text.replace(section, "old import table\n") == PAGE


def test_writing_twice_leaves_one_table(tmp_path):
    page = tmp_path / "benchmarks.md"
    page.write_text(PAGE)
    for value in ("1.00", "2.00"):
        _docs.write("eager", f"| add | {value} |", "cmd", page, commit="c", today="d", backend="cpu")
    text = page.read_text()
    assert "| add | 2.00 |" in text and "1.00" not in text and "7.8 us" not in text
    assert text.count("<!-- bench:eager -->") == 1 and text.count("Measured at") == 1


@pytest.mark.parametrize("name", ["missing", "twice"])
def test_a_page_without_exactly_one_section_is_refused(name):
    text = PAGE + "<!-- bench:twice -->\nx\n<!-- /bench:twice -->\n" * 2
    with pytest.raises(ValueError, match=f"bench:{name}"):
        _docs.replace_section(text, name, "table")


def test_section_prints_as_usual_and_writes_what_it_printed(tmp_path, monkeypatch, capsys):
    page = tmp_path / "benchmarks.md"
    page.write_text(PAGE)
    monkeypatch.setattr(_docs, "PAGE", page)
    monkeypatch.setattr(_docs, "_commit", lambda: "abc1234")
    monkeypatch.setattr(_docs, "_backend", lambda: "cpu")
    args = argparse.Namespace(markdown=False, write_docs=True)
    with _docs.section("import", args):
        print("| markdown |" if args.markdown else "plain text")
    assert capsys.readouterr().out == "| markdown |\n"
    assert "Measured at `abc1234`" in page.read_text() and "| markdown |" in page.read_text()

    args = argparse.Namespace(markdown=False, write_docs=False)
    before = page.read_text()
    with _docs.section("import", args):
        print("plain text")
    assert capsys.readouterr().out == "plain text\n" and page.read_text() == before


def test_every_script_with_the_flag_has_its_section_in_the_page():
    page = (ROOT / "docs" / "benchmarks.md").read_text()
    for script in sorted((ROOT / "bench").glob("bench_*.py")):
        names = re.findall(r'_docs\.section\("(\w+)"', script.read_text())
        for name in names:
            assert page.count(f"<!-- bench:{name} -->") == 1, f"{script.name}: no bench:{name} section"
            assert page.count(f"<!-- /bench:{name} -->") == 1, f"{script.name}: no /bench:{name} end"
