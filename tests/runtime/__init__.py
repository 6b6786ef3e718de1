"""The features of the C++ runtime core (``torch_tpu._C``): tests that need it skip, naming it,
where it was not built (CI builds it, so they run there)."""

from __future__ import annotations

import pytest

from torch_tpu.runtime import native

needs_native = pytest.mark.skipif(
    not native.available(), reason="needs the C++ runtime core torch_tpu._C (build: pip install -e .)"
)
