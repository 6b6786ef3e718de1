"""Functional collectives on tpu: eager (strict, fused) and inside ``torch.compile``."""

from __future__ import annotations

from .launch import checks_passed, torchrun


def test_functional_collectives_eager_and_compiled():
    assert checks_passed(torchrun("funcol.py")) == [73, 73]
