"""Without the C++ runtime core (not built, or for another torch) ``import torch_tpu`` works,
warns once naming what is missing, and the Python fallbacks serve."""

from __future__ import annotations

import json

from torch_tpu.runtime import native

_WITHOUT_EXTENSION = "import sys; sys.modules['torch_tpu._C'] = None\n"


def test_import_without_the_extension_warns_once_naming_what_is_missing_and_falls_back(run_python):
    out = run_python(
        _WITHOUT_EXTENSION
        + """
import json, warnings
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    import torch, torch_tpu
torch.manual_seed(5)
a = torch.randn(3, device="tpu").tolist()
torch.tpu.manual_seed(5)
state = torch.tpu.get_rng_state()
b = torch.randn(3, device="tpu").tolist()
torch.tpu.set_rng_state(state)
x = torch.arange(4.0, device="tpu")
ids = torch.zeros(1, 9, dtype=torch.int64, device="tpu")
for _ in range(3):  # appends into storage with room (its size recorded without the allocator)
    ids = torch.cat([ids, ids[:, -1:] + 1], dim=1)
print(json.dumps({
    "appended": ids.tolist(),
    "room": ids.untyped_storage().nbytes(),
    "warnings": [str(w.message) for w in caught if "C++ runtime core" in str(w.message)],
    "same_stream": a == b == torch.randn(3, device="tpu").tolist(),
    "sum": (x * 2).sum().item(),
    # the Python view kernels, each of them
    "views": x.view(2, 2).t().unfold(0, 2, 1).squeeze_(0).tolist(),
    "in_place_views": x.view(2, 2).t_().transpose_(0, 1).unsqueeze_(0).squeeze_(0).unsqueeze_(1)
    .squeeze_(1).unsqueeze_(2).squeeze_((2,)).tolist(),
    "complex_views": torch.view_as_real(torch.view_as_complex(x.view(2, 2))).tolist(),
    "reshape_alias": torch.ops.aten._reshape_alias(x, [2, 2], [1, 2]).tolist(),
    "data_ptr": x[1:].data_ptr() - x.data_ptr(),
    "pinned": torch.ones(2).pin_memory().tolist(),
    "count": torch.tpu.device_count(),
}))
"""
    )
    state = json.loads(out)
    (warning,) = state.pop("warnings")
    assert native.MISSING_WITHOUT in warning
    for feature in ("torch.Generator", "torch.accelerator", "resize_", "pin"):  # named by it
        assert feature in warning
    assert state.pop("appended") == [[0] * 9 + [1, 2, 3]]
    assert state.pop("room") == 64 * 8
    assert state.pop("views") == [[0.0, 1.0], [2.0, 3.0]]
    assert state.pop("in_place_views") == state.pop("complex_views") == [[0.0, 1.0], [2.0, 3.0]]
    assert state.pop("reshape_alias") == [[0.0, 2.0], [1.0, 3.0]]
    assert state == {"same_stream": True, "sum": 12.0, "data_ptr": 4, "pinned": [1.0, 1.0], "count": 1}
