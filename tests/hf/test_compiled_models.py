"""The architecture matrix under ``torch.compile(model, backend="tpu")``: each tiny model's
compiled forward on tpu against the same weights in CPU eager, in float32."""

from __future__ import annotations

import pytest

from torch_tpu.testing.hf_zoo import ARCHITECTURES, compiled_forward

from .test_models import TOLERANCE


@pytest.mark.parametrize("model_type", sorted(ARCHITECTURES))
def test_compiled_forward_matches_cpu(model_type):
    assert compiled_forward(model_type) <= TOLERANCE
