"""Shared fixtures: ``import torch_tpu`` once, and a way to run code in a fresh interpreter (for
environment switches read at import, and for processes that must not load torch_tpu)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

import torch_tpu  # noqa: F401  (registers the tpu device)


@pytest.fixture(autouse=True)
def _fresh_buckets():
    """Which tensors' sizes changed is learned per test: what an earlier test taught would pad
    (or not) this test's tensors depending on the order tests run in."""
    from torch_tpu.runtime.lru import Kind, caches

    caches.clear(Kind.SIZES)


@pytest.fixture
def run_python(tmp_path):
    """``run_python(code, **env)``: run ``code`` in a new Python process with ``env`` added to
    the environment (cwd ``tmp_path``); returns its stdout (and its stderr too, as a pair, with
    ``capture_stderr=True``), failing the test if it fails."""

    def run(code: str, *, capture_stderr: bool = False, **env: str):
        done = subprocess.run(
            [sys.executable, "-c", textwrap.dedent(code)],
            cwd=tmp_path,
            env={**os.environ, **env},
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0, f"subprocess failed:\n{done.stdout}\n{done.stderr}"
        return (done.stdout, done.stderr) if capture_stderr else done.stdout

    return run


@pytest.fixture
def fresh_churn():
    """The fused recorder's learned churn (which ops run alone because their shapes change from
    graph to graph), empty before and after the test: what earlier tests taught it would cut
    this test's graphs elsewhere, and a graph cut elsewhere rounds its reductions differently.
    Cleared in place, so a test's own ``monkeypatch.undo()`` cannot bring the old tables back."""
    from torch_tpu.execution import fused
    from torch_tpu.runtime.lru import Kind, caches

    caches.clear(Kind.CHURN)
    yield fused
    caches.clear(Kind.CHURN)
