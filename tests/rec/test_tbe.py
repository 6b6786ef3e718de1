"""fbgemm's table-batched embeddings (``SplitTableBatchedEmbeddingBagsCodegen`` with its fused
optimizers, ``DenseTableBatchedEmbeddingBagsCodegen``) on tpu, against the same modules on CPU:
lookups, the fused step on the touched rows and the optimizer state, over three steps; and
``bounds_check_indices``'s errors and warnings as on CPU."""

from __future__ import annotations

import pytest
import torch

import torch_tpu  # noqa: F401

pytest.importorskip("fbgemm_gpu", reason="fbgemm is not installed (scripts/install_rec.sh)")
from fbgemm_gpu.split_embedding_configs import EmbOptimType  # noqa: E402
from fbgemm_gpu.split_table_batched_embeddings_ops_training import (  # noqa: E402
    DenseTableBatchedEmbeddingBagsCodegen,
    SplitTableBatchedEmbeddingBagsCodegen,
)
from fbgemm_gpu.tbe.config.embedding_config import (  # noqa: E402
    BoundsCheckMode,
    ComputeDevice,
    EmbeddingLocation,
    PoolingMode,
)
from fbgemm_gpu.tbe.config.optimizer_config import WeightDecayMode  # noqa: E402

TABLES = [(10, 4), (20, 8)]  # (rows, width)
FEATURES = [0, 1, 1]  # feature -> table: two features share table 1
# 3 features x 2 samples; row 2 of table 0 in two bags, row 7 of table 1 three times in one
INDICES = [1, 2, 2, 5, 19, 3, 3, 0, 7, 7, 7, 1]
OFFSETS = [0, 2, 3, 5, 6, 9, 12]
STEPS = 3


def _tbe(device: str, optimizer: EmbOptimType, pooling: PoolingMode, **options):
    torch.manual_seed(0)
    specs = [(rows, width, EmbeddingLocation.HOST, ComputeDevice.CPU) for rows, width in TABLES]
    return SplitTableBatchedEmbeddingBagsCodegen(
        specs,
        feature_table_map=FEATURES,
        optimizer=optimizer,
        pooling_mode=pooling,
        learning_rate=0.5,
        eps=0.1,
        device=torch.device(device),
        **options,
    )


def _steps(module, device: str, weighted: bool) -> list:
    """The outputs of ``STEPS`` lookups, each followed by a backward of a weighted sum."""
    indices, offsets = torch.tensor(INDICES, device=device), torch.tensor(OFFSETS, device=device)
    weights = torch.linspace(0.5, 1.5, len(INDICES), device=device) if weighted else None
    outputs = []
    for _ in range(STEPS):
        out = module(indices, offsets, per_sample_weights=weights)
        (out * torch.arange(out.numel(), device=device).reshape(out.shape).sin()).sum().backward()
        outputs.append(out.detach().cpu())
    return outputs


def _close(got, expected) -> None:
    torch.testing.assert_close(got.detach().cpu(), expected.detach().cpu(), rtol=2e-6, atol=2e-6)


CASES = [
    (EmbOptimType.EXACT_SGD, {}),
    (EmbOptimType.EXACT_ADAGRAD, {}),
    (EmbOptimType.EXACT_ROWWISE_ADAGRAD, {}),
    (EmbOptimType.EXACT_SGD, {"gradient_clipping": True, "max_gradient": 0.3}),
]


@pytest.mark.parametrize("optimizer, options", CASES, ids=lambda c: getattr(c, "name", str(c)))
@pytest.mark.parametrize("pooling", [PoolingMode.SUM, PoolingMode.MEAN])
def test_fused_lookup_and_step_as_on_cpu(optimizer, options, pooling):
    cpu, tpu = _tbe("cpu", optimizer, pooling, **options), _tbe("tpu", optimizer, pooling, **options)
    assert tpu.weights_host.device.type == "tpu"
    for got, expected in zip(_steps(tpu, "tpu", False), _steps(cpu, "cpu", False)):
        _close(got, expected)
    _close(tpu.weights_host, cpu.weights_host)
    for got, expected in zip(tpu.split_optimizer_states(), cpu.split_optimizer_states()):
        for g, e in zip(got, expected):
            _close(g, e)


@pytest.mark.parametrize("mode", [WeightDecayMode.L2, WeightDecayMode.DECOUPLE])
def test_rowwise_adagrad_weight_decay_is_fbgemms_update(mode):
    # (fbgemm's CPU kernel leaves weight decay out; its GPU kernels, and tpu, apply it:
    # L2 adds decay * w to the gradient, DECOUPLE shrinks the row by lr * decay)
    lr, eps, decay = 0.5, 0.1, 0.05
    options = {"weight_decay": decay, "weight_decay_mode": mode}
    module = _tbe("tpu", EmbOptimType.EXACT_ROWWISE_ADAGRAD, PoolingMode.SUM, **options)
    with torch.no_grad():
        module.weights_host.copy_(torch.linspace(-1, 1, module.weights_host.numel()))
    w = module.weights_host.detach().cpu().double()[4:8]  # table 0, row 1
    g = torch.tensor([1.0, 2.0, 3.0, 4.0], dtype=torch.float64)
    bags = torch.tensor([0, 1] + [1] * 5, device="tpu")  # one id: row 1 of table 0, sample 0
    out = module(torch.tensor([1], device="tpu"), bags)
    out.backward(
        torch.cat([g, torch.zeros(16, dtype=torch.float64)]).float().repeat(2, 1).to("tpu")
        * torch.tensor([[1.0], [0.0]], device="tpu")
    )
    decayed = g + decay * w if mode == WeightDecayMode.L2 else g
    momentum = decayed.pow(2).mean()
    multiplier = lr / (momentum.sqrt() + eps)
    correction = 1 - multiplier * decay if mode == WeightDecayMode.L2 else 1 - lr * decay
    expected = correction * w - multiplier * g
    _close(module.weights_host.detach()[4:8], expected.float())
    _close(module.split_optimizer_states()[0][0][1], momentum.float())


def test_weighted_lookup_as_on_cpu():
    cpu = _tbe("cpu", EmbOptimType.EXACT_ROWWISE_ADAGRAD, PoolingMode.SUM)
    tpu = _tbe("tpu", EmbOptimType.EXACT_ROWWISE_ADAGRAD, PoolingMode.SUM)
    for got, expected in zip(_steps(tpu, "tpu", True), _steps(cpu, "cpu", True)):
        _close(got, expected)
    _close(tpu.weights_host, cpu.weights_host)


def test_sequence_lookup_as_on_cpu():
    tables = [(10, 4), (20, 4)]
    modules = {}
    for device in ("cpu", "tpu"):
        torch.manual_seed(0)
        specs = [(rows, width, EmbeddingLocation.HOST, ComputeDevice.CPU) for rows, width in tables]
        modules[device] = SplitTableBatchedEmbeddingBagsCodegen(
            specs,
            feature_table_map=FEATURES,
            optimizer=EmbOptimType.EXACT_SGD,
            pooling_mode=PoolingMode.NONE,
            learning_rate=0.5,
            device=torch.device(device),
        )
    for got, expected in zip(_steps(modules["tpu"], "tpu", False), _steps(modules["cpu"], "cpu", False)):
        _close(got, expected)
    _close(modules["tpu"].weights_host, modules["cpu"].weights_host)


@pytest.mark.parametrize("weighted", [False, True])
def test_dense_tbe_gives_the_weights_gradient(weighted):
    modules = {}
    for device in ("cpu", "tpu"):
        torch.manual_seed(0)
        modules[device] = DenseTableBatchedEmbeddingBagsCodegen(
            TABLES, feature_table_map=FEATURES, pooling_mode=PoolingMode.SUM, use_cpu=True
        ).to(device)
    indices, offsets = torch.tensor(INDICES), torch.tensor(OFFSETS)
    per_sample = torch.linspace(0.5, 1.5, len(INDICES), requires_grad=True) if weighted else None
    grads = {}
    for device, module in modules.items():
        weights = None if per_sample is None else per_sample.detach().to(device).requires_grad_(weighted)
        out = module(indices.to(device), offsets.to(device), per_sample_weights=weights)
        out.pow(2).sum().backward()
        grads[device] = (out, module.weights.grad, None if weights is None else weights.grad)
    for got, expected in zip(grads["tpu"], grads["cpu"]):
        if expected is not None:
            _close(got, expected)


def _bounds_check(device: str, mode: BoundsCheckMode):
    rows = torch.tensor([10, 20], device=device)
    indices = torch.tensor([1, 12, 3, 25, 4], device=device)  # 12 past table 0, 25 past table 1
    offsets = torch.tensor([0, 1, 2, 4, 5], device=device)
    warning = torch.zeros(1, dtype=torch.int64, device=device)
    torch.ops.fbgemm.bounds_check_indices(rows, indices, offsets, int(mode), warning)
    return indices.cpu(), offsets.cpu(), warning.cpu()


def test_an_id_outside_its_table_raises_in_fatal_mode_and_leaves_the_inputs():
    with pytest.raises(
        RuntimeError,
        match=r"Out of bounds access for batch: 1, table: 0, bag element: 0, idx: 12, num_rows: 10",
    ):
        _bounds_check("tpu", BoundsCheckMode.FATAL)
    assert torch.ones(2, device="tpu").sum().item() == 2.0  # (the device still works)


def test_an_id_outside_its_table_is_row_0_with_a_warning_in_warning_mode():
    expected = _bounds_check("cpu", BoundsCheckMode.WARNING)
    with pytest.warns(UserWarning, match="Out of bounds access .* Setting idx to zero"):
        got = _bounds_check("tpu", BoundsCheckMode.WARNING)
    for g, e in zip(got, expected):
        assert torch.equal(g, e)


def test_fused_module_refuses_an_id_outside_its_table_in_fatal_mode():
    module = _tbe("tpu", EmbOptimType.EXACT_SGD, PoolingMode.SUM, bounds_check_mode=BoundsCheckMode.FATAL)
    before = module.weights_host.detach().cpu().clone()
    with pytest.raises(RuntimeError, match="idx: 25, num_rows: 20"):
        module(torch.tensor([1, 25], device="tpu"), torch.tensor([0, 1, 1, 2, 2, 2, 2], device="tpu"))
    assert torch.equal(module.weights_host.detach().cpu(), before)


def test_an_update_tpu_lacks_is_refused_at_the_lookup():
    module = _tbe("tpu", EmbOptimType.EXACT_ROWWISE_ADAGRAD, PoolingMode.SUM, max_norm=1.0)
    with pytest.raises(NotImplementedError, match="rowwise_adagrad with max_norm > 0"):
        module(torch.tensor(INDICES, device="tpu"), torch.tensor(OFFSETS, device="tpu"))
