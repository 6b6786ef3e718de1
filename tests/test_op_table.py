"""The coverage report: ``python -m torch_tpu.ops`` and docs/ops.md, generated from the table."""

from __future__ import annotations

from pathlib import Path

from torch_tpu.ops._coverage import coverage, render_markdown
from torch_tpu.ops.registry import LOWERINGS

DOCS = Path(__file__).resolve().parents[1] / "docs" / "ops.md"


def test_docs_ops_md_is_generated_from_the_current_table():
    assert DOCS.read_text() == render_markdown(), (
        "docs/ops.md is stale: run `python -m torch_tpu.ops --markdown > docs/ops.md`"
    )


def test_every_lowering_is_counted_once_under_its_family():
    report = coverage()
    assert report.total == len(LOWERINGS)
    assert report.functional + report.mutating_kernels == len(LOWERINGS)
    assert "_helpers" not in report.families  # helpers register on behalf of an ops module
    assert "add.Tensor" in report.families["elementwise"]


def test_cli_prints_counts_by_family(run_python):
    text = run_python(
        "import runpy, sys; sys.argv = ['x']; runpy.run_module('torch_tpu.ops', run_name='__main__')"
    )
    report = coverage()
    assert text.startswith(f"{report.functional} functional ATen overloads lowered natively")
    for family, names in report.families.items():
        assert f"{family} ({len(names)}):" in text
