"""One comparison for the contract tests: a call built for a device gives on tpu what it gives
on CPU, results (shapes, dtypes, values) or the exception type."""

from __future__ import annotations

from collections.abc import Callable

import torch


def _outcome(build: Callable[[str], object], device: str):
    try:
        result = build(device)
    except Exception as error:  # noqa: BLE001  (the exception type is what is compared)
        return type(error), None
    leaves = [t.cpu() for t in torch.utils._pytree.tree_leaves(result) if isinstance(t, torch.Tensor)]
    return None, leaves


def assert_matches_cpu(build: Callable[[str], object]) -> None:
    expected_error, expected = _outcome(build, "cpu")
    actual_error, actual = _outcome(build, "tpu")
    assert actual_error is expected_error, f"tpu: {actual_error}, CPU: {expected_error}"
    if expected is not None:
        assert [t.shape for t in actual] == [t.shape for t in expected]
        torch.testing.assert_close(actual, expected, equal_nan=True)
