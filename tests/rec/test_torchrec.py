"""TorchRec 1.9.2 on tpu, unmodified modules: ``EmbeddingBagCollection`` forward and backward,
``EmbeddingCollection``, ``KeyedJaggedTensor.permute`` and ``KeyedTensor.regroup`` (fbgemm's ops
lowered by ``integrations.fbgemm``), against the same calls on CPU. Runs where TorchRec is
installed (scripts/install_rec.sh).

TorchRec's ``KeyedJaggedTensor.to`` copies a cached per-key split (``to_dict``'s) without moving
it, on any device: each test builds its tpu KJT from tensors, as a data loader does."""

from __future__ import annotations

import copy

import pytest
import torch

import torch_tpu  # noqa: F401

torchrec = pytest.importorskip("torchrec", reason="TorchRec is not installed (scripts/install_rec.sh)")
from torchrec import (  # noqa: E402
    EmbeddingBagCollection,
    EmbeddingBagConfig,
    EmbeddingCollection,
    EmbeddingConfig,
    KeyedJaggedTensor,
    KeyedTensor,
)

TPU = torch.device("tpu")
KEYS = ["f1", "f2", "f3"]
VALUES = [1, 2, 3, 4, 5, 6, 19]
LENGTHS = [2, 1, 1, 2, 0, 1]  # 3 features x a batch of 2, one bag empty


def _kjt(device, keys=KEYS) -> KeyedJaggedTensor:
    """The first ``keys`` of the batch (2 samples per key)."""
    lengths = LENGTHS[: 2 * len(keys)]
    return KeyedJaggedTensor.from_lengths_sync(
        keys=keys,
        values=torch.tensor(VALUES[: sum(lengths)], device=device),
        lengths=torch.tensor(lengths, device=device),
    )


def _ebc(pooling: str) -> EmbeddingBagCollection:
    torch.manual_seed(0)
    tables = [
        EmbeddingBagConfig(
            name="t1", embedding_dim=8, num_embeddings=20, feature_names=["f1"], pooling=pooling
        ),
        EmbeddingBagConfig(
            name="t2", embedding_dim=4, num_embeddings=30, feature_names=["f2", "f3"], pooling=pooling
        ),
    ]
    return EmbeddingBagCollection(tables=tables, device=torch.device("cpu"))


def _exact(got: torch.Tensor, expected: torch.Tensor) -> None:
    assert got.device.type == "tpu"
    torch.testing.assert_close(got.detach().cpu(), expected.detach(), rtol=1.3e-6, atol=1e-6)


@pytest.mark.parametrize("pooling", [torchrec.PoolingType.SUM, torchrec.PoolingType.MEAN], ids=str)
def test_embedding_bag_collection_forward_regroup_and_backward(pooling):
    cpu_module = _ebc(pooling)
    tpu_module = copy.deepcopy(cpu_module).to("tpu")
    outputs = {}
    for device, module in (("cpu", cpu_module), ("tpu", tpu_module)):
        pooled = module(_kjt(device))
        groups = KeyedTensor.regroup([pooled], [["f1", "f3"], ["f2"]])
        sum(g.pow(2).sum() for g in groups).backward()
        outputs[device] = (pooled.values(), groups)
    _exact(outputs["tpu"][0], outputs["cpu"][0])
    for got, expected in zip(outputs["tpu"][1], outputs["cpu"][1], strict=True):
        _exact(got, expected)
    for expected, got in zip(cpu_module.parameters(), tpu_module.parameters()):
        _exact(got.grad, expected.grad)


def test_embedding_collection_looks_up_each_id():
    torch.manual_seed(0)
    config = EmbeddingConfig(name="t1", embedding_dim=8, num_embeddings=20, feature_names=["f1", "f2"])
    cpu_module = EmbeddingCollection(tables=[config], device=torch.device("cpu"))
    tpu_module = copy.deepcopy(cpu_module).to("tpu")
    expected, got = cpu_module(_kjt("cpu", KEYS[:2])), tpu_module(_kjt(TPU, KEYS[:2]))
    for key in KEYS[:2]:
        _exact(got[key].values(), expected[key].values())
        assert torch.equal(got[key].lengths().cpu(), expected[key].lengths())


def test_keyed_jagged_tensor_permute_and_split():
    cpu, tpu = _kjt("cpu"), _kjt(TPU)
    for order in ([2, 0, 1], [1, 1], [0]):
        expected, got = cpu.permute(order), tpu.permute(order)
        assert got.keys() == expected.keys() and got.values().device.type == "tpu"
        assert torch.equal(got.values().cpu(), expected.values())
        assert torch.equal(got.lengths().cpu(), expected.lengths())
        assert torch.equal(got.offsets().cpu(), expected.offsets())
    for got, expected in zip(tpu.split([1, 2]), cpu.split([1, 2])):
        assert torch.equal(got.values().cpu(), expected.values())


def _dlrm_losses(device, dtype=torch.float32, steps=3) -> torch.Tensor:
    """TorchRec's DLRM (3 tables, dense and over arches) trained with SGD on one random batch."""
    from torchrec.models.dlrm import DLRM

    torch.manual_seed(0)
    tables = [
        EmbeddingBagConfig(name=f"t{i}", embedding_dim=8, num_embeddings=50, feature_names=[f"f{i}"])
        for i in range(3)
    ]
    model = DLRM(
        embedding_bag_collection=EmbeddingBagCollection(tables=tables, device=torch.device("cpu")),
        dense_in_features=4,
        dense_arch_layer_sizes=[16, 8],
        over_arch_layer_sizes=[16, 1],
    ).to(device, dtype)
    generator = torch.Generator().manual_seed(1)
    lengths = torch.randint(0, 3, (3 * 4,), generator=generator)
    values = torch.randint(0, 50, (int(lengths.sum()),), generator=generator)
    dense, labels = torch.randn(4, 4, generator=generator), torch.randint(0, 2, (4,), generator=generator)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    for _ in range(steps):
        features = KeyedJaggedTensor.from_lengths_sync(
            keys=["f0", "f1", "f2"], values=values.to(device), lengths=lengths.to(device)
        )
        logits = model(dense.to(device, dtype), features).squeeze(-1)
        loss = torch.nn.functional.binary_cross_entropy_with_logits(logits, labels.to(device, dtype))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.detach().cpu())
    return torch.stack(losses)


def test_dlrm_trains_as_on_cpu():
    from torch_tpu.testing.reference import assert_matches_cpu

    tpu, cpu, reference = _dlrm_losses(TPU), _dlrm_losses("cpu"), _dlrm_losses("cpu", torch.float64)
    assert_matches_cpu(tpu, cpu, reference, "DLRM losses")
    assert cpu[-1] < cpu[0]


def test_fused_embedding_bag_collection_steps_as_on_cpu():
    from fbgemm_gpu.tbe.config.embedding_config import EmbeddingLocation
    from torchrec.modules.embedding_configs import PoolingType
    from torchrec.modules.fused_embedding_modules import FusedEmbeddingBagCollection

    def fused(device, **location):
        torch.manual_seed(0)
        tables = _ebc(PoolingType.SUM)._embedding_bag_configs
        return FusedEmbeddingBagCollection(
            tables=tables, optimizer_type=torch.optim.SGD, optimizer_kwargs={"lr": 0.5},
            device=torch.device(device), **location,
        )  # fmt: skip

    cpu, tpu = fused("cpu"), fused("tpu")  # (tpu: no location given, TorchRec's host path)
    tpu.load_state_dict(cpu.state_dict())
    for _ in range(2):  # (the second lookup reads the rows the first step moved)
        outputs = []
        for module, device in ((cpu, "cpu"), (tpu, TPU)):
            outputs.append(module(_kjt(device)).values())
            outputs[-1].pow(2).sum().backward()
        _exact(outputs[1], outputs[0])
    for name, value in cpu.state_dict().items():
        _exact(tpu.state_dict()[name], value)
    assert fused("tpu", location=EmbeddingLocation.HOST)._emb_modules  # (the explicit form)


@pytest.mark.parametrize(
    "values, lengths",
    [([1, 2], [2, 1]), ([1, 2, 3, 4], [2, 1]), ([1, 12, 3], [2, 1])],
    ids=["fewer values than lengths", "more values than lengths", "an id outside its table"],
)
def test_bad_batches_raise_cpus_error(values, lengths):
    tables = [EmbeddingBagConfig(name="t1", embedding_dim=4, num_embeddings=10, feature_names=["f1"])]
    errors = []
    for device in ("cpu", TPU):
        torch.manual_seed(0)
        ebc = EmbeddingBagCollection(tables=tables, device=torch.device(device))
        kjt = KeyedJaggedTensor(
            keys=["f1"],
            values=torch.tensor(values, device=device),
            lengths=torch.tensor(lengths, device=device),
        )
        with pytest.raises(Exception) as error:
            ebc(kjt).values().cpu()
        errors.append(error.value)
    assert type(errors[1]) is type(errors[0]) and str(errors[1]) == str(errors[0])
    assert torch.ones(2, device=TPU).sum().item() == 2.0  # (the device still works)


def test_a_table_larger_than_the_chip_is_an_out_of_memory_error():
    # (TorchRec's planner counts no HBM for tpu, as for any device but cuda and mtia: it plans
    # such a table, and its allocation is refused)
    rows = 2 * torch.tpu.get_device_properties(0).total_memory // (64 * 4)
    tables = [EmbeddingBagConfig(name="big", embedding_dim=64, num_embeddings=rows, feature_names=["f"])]
    with pytest.raises(torch.OutOfMemoryError, match="tpu out of memory"):
        EmbeddingBagCollection(tables=tables, device=TPU)
    assert torch.ones(2, device=TPU).sum().item() == 2.0
