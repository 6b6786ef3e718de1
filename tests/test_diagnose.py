"""``torch_tpu.diagnose()`` and ``python -m torch_tpu.diagnose script.py``: the report names
what the code made torch_tpu do, at the user's lines, with hints."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys
import textwrap

import torch

import torch_tpu
from torch_tpu.runtime import events

SCRIPT = """
    import sys
    import torch
    import torch_tpu  # noqa: F401

    w = torch.ones(4, 4, device="tpu")
    for step in range(4):
        x = torch.ones(step + 2, 4, device="tpu")
        y = (x @ w).sum()  # NEW SHAPE
        print(y.item())  # ITEM
    d = torch.ones(1, 5, device="tpu")
    z = torch.sparse.spdiags(d, torch.tensor([0]), (5, 5))  # FALLBACK
    sys.exit(int(sys.argv[1]))
"""


def _line(script: str, marker: str) -> int:
    return next(i for i, text in enumerate(script.splitlines(), 1) if f"# {marker}" in text)


def test_command_line_names_syncs_shape_changes_and_fallbacks(tmp_path):
    script = textwrap.dedent(SCRIPT)
    (tmp_path / "script.py").write_text(script)
    env = {**os.environ, "TORCH_TPU_CPU_FALLBACK": "1", "TORCH_TPU_BUCKETS": "0"}
    done = subprocess.run(
        [sys.executable, "-m", "torch_tpu.diagnose", "--html", "report.html", "script.py", "3"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 3, done.stderr  # the script's exit code, its argv passed on
    assert done.stdout.split() == ["32.0", "48.0", "64.0", "80.0"]
    report = done.stderr
    item, shape, fallback = (f"script.py:{_line(script, m)}" for m in ("ITEM", "NEW SHAPE", "FALLBACK"))
    assert f"4  item  at {item}" in report
    assert f"`.item()` at {item} ran 4 times" in report
    assert f"ops at {shape} compiled again and again (aten.mm.default 4" in report
    assert "TORCH_TPU_BUCKETS=1" in report
    assert f"aten._spdiags.default runs on CPU fallback at {fallback}" in report
    assert "device time:" in report and "aten::mm (4 calls)" in report
    page = (tmp_path / "report.html").read_text()
    assert page.count("<svg") == 3 and "aten::mm" in page and "jit_product" in page
    assert "`.item()`" in page  # (the hints)


def test_context_manager_fills_a_report_and_stops_at_exit():
    x = torch.arange(6.0, device="tpu")
    with torch_tpu.diagnose(print=False) as report:
        for _ in range(3):
            total = (x * 2).sum().item()
        rows = x[x > 2].cpu()
    assert total == 30.0 and rows.tolist() == [3.0, 4.0, 5.0]
    assert report.ops["aten.mul.Tensor"] == 3 and report.ops["aten._local_scalar_dense.default"] == 3
    kinds = {site.what: n for site, n in report.syncs.items()}
    assert kinds["item"] == 3 and kinds["cpu/tolist"] == 1 and kinds["data-dependent shape"] >= 1
    assert {os.path.basename(site.line).split(":")[0] for site in report.syncs} == {"test_diagnose.py"}
    assert any("`.item()`" in hint for hint in report.hints)
    assert report.wall_seconds > 0 and report.matmul_precision
    assert "host syncs: " in report.text()
    before = report.ops.total()
    (x + 1).sum().item()
    assert report.ops.total() == before  # nothing collected after the block
    assert not events.listeners and events.explaining == events.printing


def test_diagnosis_is_not_imported_with_torch_tpu(run_python):
    out = run_python("""
        import sys, torch, torch_tpu
        print("torch_tpu.diagnosis" in sys.modules, callable(torch_tpu.diagnose))
        import torch_tpu.diagnose
        print(callable(torch_tpu.diagnose))
    """)
    assert out.split() == ["False", "True", "True"]


def test_the_docs_example_runs(capsys):
    text = (pathlib.Path(__file__).parents[1] / "docs" / "profiling.md").read_text()
    section = text.split("## Diagnosis: `torch_tpu.diagnose`")[1].split("\n## ")[0]
    (snippet,) = [part.split("```")[0] for part in section.split("```python\n")[1:]]
    exec(compile(snippet, "docs/profiling.md", "exec"), {})
    assert capsys.readouterr().out.startswith("item docs/profiling.md:8 4\n")


def test_device_side_from_a_profiler_session_unless_one_records_already():
    from torch.profiler import profile

    x = torch.ones(32, 32, device="tpu")
    with torch_tpu.diagnose(print=False) as report:
        (x @ x).relu().sum().item()
    device = report.device
    assert device.ops[0].device_us > 0 and {op.name for op in device.ops} >= {"aten::mm", "aten::relu"}
    assert device.runs and device.memory and device.memory[0][1] > 0
    with torch_tpu.diagnose(print=False, profile=False) as report:
        (x + 1).sum().item()
    assert report.device is None and "device time" not in report.text()
    with profile() as prof, torch_tpu.diagnose(print=False) as report:  # (the user's own profiler)
        (x + 2).sum().item()
    assert report.device is None and any(e.name == "aten::add" for e in prof.events())
