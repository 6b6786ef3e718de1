"""How ops execute: eagerly op by op, recorded into fused graphs, or traced into one program.

``modes`` is the public API (also exported as ``torch_tpu.eager_mode`` and friends); ``fused``
records and runs fused-eager graphs; ``tracing`` is the state of a compiled program's trace.
"""

from .modes import (  # noqa: F401
    EagerMode,
    eager_mode,
    get_eager_mode,
    last_sync_reason,
    pending_ops,
    pending_stablehlo,
    set_eager_mode,
)
