"""Which source files are library code (torch's, torch_tpu's, jax's) and which the user's: the
folders :func:`events.user_line` skips and :func:`padding.user_call_site` walks through."""

from __future__ import annotations

import functools
import os
from typing import NamedTuple

#: torch_tpu's folder
PACKAGE = os.path.dirname(os.path.dirname(__file__))
#: the demo and testing helpers: user-level code shipped in the package (a line to blame)
USER_DIRS = tuple(os.path.join(PACKAGE, d) for d in ("demo", "testing"))


class LibraryDirs(NamedTuple):
    """The libraries' folders, each ending in a separator."""

    torch: str
    torch_tpu: str
    jax: str


@functools.cache
def library_dirs() -> LibraryDirs:
    """torch's, torch_tpu's and jax's folders (torch and jax imported when first asked)."""
    import jax
    import torch

    return LibraryDirs(
        os.path.dirname(torch.__file__) + os.sep, PACKAGE + os.sep, os.path.dirname(jax.__file__) + os.sep
    )
