"""``python -m torch_tpu doctor``: the report, its verdict and exit code, on this install and on
one whose C++ core cannot load (two subprocesses; the rest renders records in process)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from torch_tpu import doctor
from torch_tpu.__main__ import main

#: Runs ``python -m torch_tpu`` with ``torch_tpu._C`` made unimportable, as when the extension
#: was not built or was built for another torch (``runtime/native.py`` then warns and goes on).
_WITHOUT_CORE = textwrap.dedent(
    """
    import importlib.abc, runpy, sys

    class HideCore(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            if name == "torch_tpu._C":
                raise ImportError("torch_tpu._C hidden by the test")

    sys.meta_path.insert(0, HideCore())
    runpy.run_module("torch_tpu", run_name="__main__", alter_sys=True)
    """
)


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory) -> str:
    """One persistent cache for both runs: the second finds the self-test's programs compiled."""
    return str(tmp_path_factory.mktemp("doctor-cache"))


def _doctor(cache_dir: str, *args: str, prefix: tuple[str, ...] = ("-m", "torch_tpu")):
    env = {**os.environ, "TORCH_TPU_CACHE_DIR": cache_dir, "TORCH_TPU_NO_SUCH_SWITCH": "1"}
    return subprocess.run(
        [sys.executable, *prefix, "doctor", *args], env=env, capture_output=True, text=True, timeout=300
    )


def test_healthy_install_reports_ok(cache_dir):
    done = _doctor(cache_dir)
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr}"
    lines = done.stdout.splitlines()
    assert lines[-1] == "torch_tpu doctor: OK"
    for version in ("python", "torch", "jax", "jaxlib", "torch_tpu"):
        assert any(line.split()[:1] == [version] for line in lines), version
    assert lines[lines.index("Persistent compilation cache") + 1].split() == ["directory", cache_dir]
    assert "TORCH_TPU_NO_SUCH_SWITCH" in done.stdout and "unknown" in done.stdout
    for check in doctor.CHECKS:
        assert any(line.split()[:2] == [check, "pass"] for line in lines), check


def test_missing_core_is_broken(cache_dir):
    done = _doctor(cache_dir, "--json", prefix=("-c", _WITHOUT_CORE))
    assert done.returncode == 1, f"{done.stdout}\n{done.stderr}"
    report = json.loads(done.stdout)
    assert report["ok"] is False
    assert report["core"]["built"] and not report["core"]["loaded"]
    assert len(report["problems"]) == 1 and "C++ core" in report["problems"][0]  # (the self-test passes)
    assert report["cache"]["directory"] == cache_dir
    assert {check["name"] for check in report["checks"]} == set(doctor.CHECKS)


def _report(**changes) -> doctor.Report:
    report = doctor.Report(
        platform=doctor.Platform("XLA:CPU (stand-in)", "cpu", {"cpu": 1}, torch_device_count=1),
        versions={"python": "3.11.7", "torch": "2.13.0"},
        core=doctor.Core(built=True, loaded=True, path="_C.so"),
        cache=doctor.Cache("/cache", files=3, megabytes=1.5),
        switches=[doctor.Switch("TORCH_TPU_BUCKETS", "0", known=True)],
        checks=[doctor.Check("ops", passed=True, seconds=0.5)],
    )
    for name, value in changes.items():
        setattr(report, name, value)
    return report


def test_verdict_counts_problems():
    assert _report().verdict() == "torch_tpu doctor: OK"
    broken = _report(
        core=doctor.Core(built=False, loaded=False, error="No module named 'torch_tpu._C'"),
        checks=[doctor.Check("ops", passed=False, seconds=0.5, error="AssertionError: matmul differs\nmore")],
    )
    text = doctor.render_text(broken)
    assert text.splitlines()[-1] == "torch_tpu doctor: BROKEN (2 problems)"
    assert "problem: self-test 'ops' failed: AssertionError: matmul differs" in text
    assert "to build it" in text and "more" in text  # (the whole message under its check)
    as_json = json.loads(doctor.render_json(broken))
    assert as_json["ok"] is False and as_json["verdict"] == "torch_tpu doctor: BROKEN (2 problems)"
    no_device = _report(platform=doctor.Platform(error="RuntimeError: no backend"))
    assert "the device did not start: RuntimeError: no backend" in no_device.problems


def test_switches_and_versions():
    environ = {"TORCH_TPU_BUCKETS": "0", "TORCH_TPU_BUCKET": "0", "TPU_LAUNCH_BLOCKING": "1", "HOME": "/"}
    assert doctor.switches_section(environ) == [
        doctor.Switch("TORCH_TPU_BUCKET", "0", known=False),
        doctor.Switch("TORCH_TPU_BUCKETS", "0", known=True),
        doctor.Switch("TPU_LAUNCH_BLOCKING", "1", known=True),
    ]
    versions = doctor.versions_section()
    assert {"python", "torch_tpu", "torch", "jax", "jaxlib"} <= versions.keys()


def test_no_command_prints_help(capsys):
    assert main([]) == 0
    assert "doctor" in capsys.readouterr().out
