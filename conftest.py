"""Session gate: when the whole suite runs, every registered tpu lowering must have been reached.

Each pytest process (xdist workers included) records the ATen overloads that hit a tpu kernel and
writes them to a shared folder; the controlling process merges them and fails the run if a
lowering in the table was never exercised (an untested lowering is an unvalidated one).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

_TESTS = Path(__file__).parent / "tests"
_DIR_VAR = "TORCH_TPU_REACHED_OPS_DIR"


def _runs_whole_suite(config) -> bool:
    option = config.option
    if option.keyword or option.markexpr or getattr(option, "lf", False) or option.collectonly:
        return False
    args = config.args or [str(_TESTS)]
    return all(Path(config.rootpath, a).resolve() == _TESTS.resolve() for a in args)


def pytest_configure(config):
    import torch

    import torch_tpu  # noqa: F401
    import torch_tpu.ops.dispatch as dispatch

    torch.tpu.init()  # the table is installed on first use; the tests count from here
    dispatch.record_ops(True)
    if not hasattr(config, "workerinput") and _DIR_VAR not in os.environ:
        os.environ[_DIR_VAR] = tempfile.mkdtemp(prefix="torch_tpu_reached_")


def pytest_sessionfinish(session, exitstatus):
    import torch_tpu.ops.dispatch as dispatch
    from torch_tpu.ops.registry import LOWERINGS

    folder = Path(os.environ[_DIR_VAR])
    worker = getattr(session.config, "workerinput", {}).get("workerid", "main")
    (folder / f"{worker}.txt").write_text("\n".join(sorted(map(str, dispatch.recorded_ops or ()))))
    if hasattr(session.config, "workerinput") or not _runs_whole_suite(session.config):
        return
    reached = set()
    for path in folder.glob("*.txt"):
        reached.update(path.read_text().split())
    # (a view's Python kernel serves only without the C++ runtime core, whose CPU kernels
    # serve the suite: tests/runtime/test_native_fallback.py runs those in a process of its own)
    missing = sorted(
        str(op) for op in LOWERINGS if str(op) not in reached and op not in dispatch.SERVED_BY_THE_CORE
    )
    if missing:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        message = f"{len(missing)} tpu lowerings were never exercised by the test suite:\n  " + "\n  ".join(
            missing
        )
        if reporter:
            reporter.write_sep("=", "unexercised lowerings", red=True)
            reporter.write_line(message)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
