"""Keep Dynamo out of torch_tpu's runtime, from the first compiled frame on.

The runtime (dispatcher, lowerings, fused eager, tracing, the device module, the compile backend,
integrations) runs *beneath* compiled code; it is never something to compile. Dynamo still meets
it: an eager op that runs between two graph pieces reaches our kernels as a new Python frame,
which Dynamo would compile like user code, tracing on into JAX, ml_dtypes and ``logging``
until something breaks the graph. Two rules, registered once when ``torch._dynamo``
is imported (``import torch_tpu`` does not import it, which would cost seconds), keep it out:

- the runtime's files join Dynamo's skip list, so compiled code that calls a runtime function
  (``torch.tpu.synchronize()``) breaks the graph at the call instead of tracing into it;
- every code object of the runtime is marked "skip, and everything it calls", so a runtime frame
  entered from eager code (a kernel the dispatcher calls) runs without Dynamo down to its last
  callee, where the skip list alone would only skip that first frame.

Code that merely lives in the package, such as the demo model (:mod:`torch_tpu.demo.model`) and
the test helpers, is user code: not in :data:`RUNTIME_PATHS`, so Dynamo traces it like any model.

Code objects are marked as their modules load: the runtime's JAX-computing modules load only
when the device starts, and Dynamo's import must not start it (:func:`refresh` is called again
then, and by the compile backend).
"""

from __future__ import annotations

import functools
import os
import sys
import types
from collections.abc import Iterator
from pathlib import Path

from .import_hooks import after_import

#: The runtime, as paths inside the package (a folder ends with ``/``). Everything else in the
#: package (``demo/``, ``testing/``, and ``kernels/``, whose wrappers call their custom ops as
#: user code would: a compiled function calling one keeps it in its graph) is traced like user
#: code.
RUNTIME_PATHS = (
    "__init__.py",
    "_autoload.py",
    "_loader.py",
    "config.py",
    "device.py",
    "memory.py",
    "__main__.py",
    "doctor.py",
    "diagnose.py",
    "diagnosis/",
    "agent/",
    "runtime/",
    "execution/",
    "ops/",
    "frontends/",
    "integrations/",
    "distributed/",
    "pallas/",
    "_internal/",
)

#: Runtime functions (qualified names) that call back into user code: ``backward()`` runs the
#: user's tensor hooks and custom backward functions. Dynamo skips these frames but still sees
#: what they call, as it would without torch_tpu.
CALLS_USER_CODE = ("_SyncingEngine.run_backward",)


def _package_dir() -> Path:
    return Path(sys.modules["torch_tpu"].__path__[0])


@functools.cache
def runtime_prefixes() -> tuple[str, ...]:
    """:data:`RUNTIME_PATHS` as absolute POSIX paths, the form Dynamo compares file names in."""
    root = _package_dir().as_posix()
    return tuple(f"{root}/{path}" for path in RUNTIME_PATHS)


def is_runtime(filename: str) -> bool:
    """Whether the source file ``filename`` belongs to torch_tpu's runtime."""
    return Path(os.path.normpath(filename)).as_posix().startswith(runtime_prefixes())


def _runtime_module_names() -> Iterator[str]:
    root = _package_dir()
    for path in RUNTIME_PATHS:
        files = sorted((root / path).rglob("*.py")) if path.endswith("/") else [root / path]
        for file in files:
            parts = file.relative_to(root).with_suffix("").parts
            if parts[-1] == "__main__":  # a command line, run only as a script
                continue
            if parts[-1] == "__init__":
                parts = parts[:-1]
            yield ".".join(("torch_tpu", *parts))


def _code_objects(module: types.ModuleType) -> Iterator[types.CodeType]:
    """The code objects ``module`` defines: its functions' and classes' methods', and, through
    their constants, every function nested in them (the dispatcher's kernels are such closures)."""
    pending, seen = list(vars(module).values()), set()
    while pending:
        obj = pending.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        if isinstance(obj, types.CodeType):
            yield obj
            pending.extend(c for c in obj.co_consts if isinstance(c, types.CodeType))
        elif isinstance(obj, types.FunctionType):
            pending.extend((obj.__code__, *vars(obj).values()))  # __wrapped__ among them
        elif isinstance(obj, (staticmethod, classmethod)):
            pending.append(obj.__func__)
        elif isinstance(obj, property):
            pending.extend((obj.fget, obj.fset, obj.fdel))
        elif isinstance(obj, type) and obj.__module__ == module.__name__:
            pending.extend(vars(obj).values())


_marked: set[str] = set()  # runtime modules whose code objects Dynamo already skips


def _register(_dynamo: types.ModuleType) -> None:
    from torch._dynamo import trace_rules

    prefixes = runtime_prefixes()
    trace_rules.SKIP_DIRS.extend(p for p in prefixes if p not in trace_rules.SKIP_DIRS)
    # (what trace_rules.add does for a module name, where torch_tpu's __init__.py would stand
    # for the whole package)
    trace_rules._recompile_re()
    refresh()


def refresh() -> None:
    """Mark the code of every runtime module loaded so far (once Dynamo is loaded)."""
    if "torch._dynamo" not in sys.modules:
        return
    from torch._dynamo.eval_frame import set_code_exec_strategy
    from torch._dynamo.types import FrameAction, FrameExecStrategy

    skip_all = FrameExecStrategy(FrameAction.SKIP, FrameAction.SKIP)
    skip_frame = FrameExecStrategy(FrameAction.SKIP, FrameAction.DEFAULT)
    for name in _runtime_module_names():
        module = sys.modules.get(name)
        if module is None or name in _marked:
            continue
        _marked.add(name)
        for code in _code_objects(module):
            if is_runtime(code.co_filename):
                calls_user = code.co_qualname in CALLS_USER_CODE
                set_code_exec_strategy(code, skip_frame if calls_user else skip_all)


def install() -> None:
    """Register the rules once Dynamo is imported (now, if it is)."""
    after_import("torch._dynamo", _register)
