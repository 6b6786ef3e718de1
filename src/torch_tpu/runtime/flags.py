"""The switches the per-op paths test, in one object that Python and the C++ core both read.

Every op's path (Python's ``Compute.call`` and the C++ core's planned kernels and fused
recording) first asks whether anything unusual is on: a job waiting, a second device, meta
checks, op recording, recompile logging. Those answers live here, as the slots of one
:class:`CoreFlags` object, :data:`flags`. The C++ core is handed the object once
(``_C.configure_flags``) and reads each slot at its offset, as a struct field; Python reads the
same attributes. So a flag set here is seen by both sides at once, and nothing reads another
module's globals.

Each flag has one owner, the module that sets it (tests set them with ``monkeypatch.setattr``):

====================  =========================================================================
``attention_needed``  :mod:`.platform` (:func:`~.platform.request_attention`, a forked child)
``others_used``       :mod:`.platform` (a device other than ``tpu:0`` was used)
``check_meta``        ``TORCH_TPU_CHECK_META`` (``config.check_meta``); tests set it here
``recorded_ops``      :mod:`torch_tpu.ops.dispatch.recording` (None, or the set ops join)
``log_recompiles``    :mod:`.events` (whether reasons for compiles are worked out)
``record_in_core``    :mod:`torch_tpu.execution.fused` (repeated nodes recorded in C++)
``max_nodes``         :mod:`torch_tpu.execution.fused` (a graph runs at this many nodes)
====================  =========================================================================

>>> from torch_tpu.runtime.flags import flags
>>> flags.others_used, flags.max_nodes
(False, 5000)
"""

from __future__ import annotations

from .. import config
from . import native


class CoreFlags:
    """The flags (see the module docstring). The C++ core reads the slots by name
    (``csrc/runtime/CoreFlags.h``; ``native.check_python_names`` checks them at start)."""

    __slots__ = (
        "attention_needed",
        "others_used",
        "check_meta",
        "recorded_ops",
        "log_recompiles",
        "record_in_core",
        "max_nodes",
    )

    def __init__(self) -> None:
        self.attention_needed = False
        self.others_used = False
        self.check_meta = config.check_meta
        self.recorded_ops: set | None = None
        self.log_recompiles = False
        self.record_in_core = False
        self.max_nodes = 5000

    def __repr__(self) -> str:
        return "CoreFlags(" + ", ".join(f"{name}={getattr(self, name)!r}" for name in self.__slots__) + ")"


#: The process's flags (the one instance; the C++ core reads this object).
flags = CoreFlags()

if native.available():
    native._C.configure_flags(flags)
