"""Saving, loading and copying tpu tensors: torch.save/torch.load (both formats), pickle,
copy.deepcopy, safetensors, and the storage API they are built on."""

from __future__ import annotations

import copy
import io
import json
import pickle

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file, save_model

TPU = torch.device("tpu")


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(4, 3), torch.nn.LayerNorm(3), torch.nn.Linear(3, 2, bias=False)
    )


def assert_state_equal(actual: dict, expected: dict, device: str) -> None:
    assert actual.keys() == expected.keys()
    for name, value in expected.items():
        assert actual[name].device.type == device, name
        assert actual[name].dtype == value.dtype, name
        assert torch.equal(actual[name].cpu(), value.cpu()), name


def _round_trip(obj, **load_kwargs):
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    buffer.seek(0)
    return torch.load(buffer, **load_kwargs)


# ----------------------------------------------------------------------------- torch.save / load
@pytest.mark.parametrize(
    "dtype",
    [torch.float32, torch.bfloat16, torch.float16, torch.int64, torch.bool, torch.complex64, torch.uint8],
    ids=str,
)
@pytest.mark.parametrize("map_location,device", [(None, "tpu"), ("cpu", "cpu"), ("tpu", "tpu")])
def test_save_tpu_tensor(dtype, map_location, device):
    cpu = (torch.arange(12) - 5).reshape(3, 4).to(dtype)
    loaded = _round_trip(cpu.to(TPU), map_location=map_location)
    assert loaded.device.type == device and loaded.dtype == dtype
    assert torch.equal(loaded.cpu(), cpu)


def test_load_cpu_checkpoint_onto_tpu():
    cpu = {"w": torch.randn(3, 4), "b": torch.arange(5), "h": torch.randn(2).bfloat16()}
    for location in ("tpu", "tpu:0", TPU, {"cpu": "tpu"}, lambda storage, _: storage.tpu()):
        assert_state_equal(_round_trip(cpu, map_location=location), cpu, "tpu")


def test_state_dict_round_trip():
    model = _model().to(TPU)
    state = model.state_dict()
    on_cpu = _round_trip(state, map_location="cpu")
    assert_state_equal(on_cpu, state, "cpu")
    fresh = _model().to(TPU)
    torch.nn.init.zeros_(fresh[0].weight)
    fresh.load_state_dict(_round_trip(state))
    assert_state_equal(fresh.state_dict(), state, "tpu")
    x = torch.randn(5, 4)
    assert torch.equal(fresh(x.to(TPU)).cpu(), model(x.to(TPU)).cpu())


def test_views_keep_their_geometry_and_share_storage_after_load():
    base = torch.arange(24.0, device=TPU).view(4, 6)
    views = {"base": base, "t": base.t()[1:, ::2], "row": base[2], "flat": base.view(-1)[5:9]}
    for location, device in ((None, "tpu"), ("cpu", "cpu")):
        loaded = _round_trip(views, map_location=location)
        for name, view in views.items():
            assert loaded[name].device.type == device
            assert loaded[name].stride() == view.stride()
            assert loaded[name].storage_offset() == view.storage_offset()
            assert torch.equal(loaded[name].cpu(), view.cpu())
        storages = {loaded[name].untyped_storage()._cdata for name in views}
        assert len(storages) == 1
        loaded["base"][2, 1] = -1  # a write through one is seen by the others
        assert loaded["row"][1].item() == -1


def test_save_sees_writes_through_dtype_views_and_lazy_empties():
    x = torch.zeros(4, device=TPU)
    x.view(torch.int32)[1] = 0x3F800000  # the storage value is int32 now; the bytes are 1.0f
    empty = torch.empty(3, device=TPU)  # never written: saved as the zeros it reads as
    loaded = _round_trip({"x": x, "empty": empty}, map_location="cpu")
    assert loaded["x"].tolist() == [0.0, 1.0, 0.0, 0.0]
    assert loaded["empty"].shape == (3,)
    assert torch.equal(loaded["empty"], empty.cpu())


def test_legacy_format_round_trip():
    cpu = torch.randn(3, 4)
    buffer = io.BytesIO()
    torch.save({"x": cpu.to(TPU), "n": 3}, buffer, _use_new_zipfile_serialization=False)
    for location, device in ((None, "tpu"), ("cpu", "cpu")):
        buffer.seek(0)
        loaded = torch.load(buffer, map_location=location, weights_only=False)
        assert loaded["n"] == 3 and loaded["x"].device.type == device
        assert torch.equal(loaded["x"].cpu(), cpu)


def test_tpu_checkpoint_loads_without_torch_tpu(run_python, tmp_path):
    model = _model().to(TPU)
    torch.save(model.state_dict(), tmp_path / "model.pt")
    expected = {k: v.cpu().tolist() for k, v in model.state_dict().items()}
    out = run_python(
        """
        import json, sys, torch
        state = torch.load("model.pt", map_location="cpu")
        print(json.dumps({"torch_tpu": "torch_tpu" in sys.modules,
                          "devices": sorted({str(v.device) for v in state.values()}),
                          "values": {k: v.tolist() for k, v in state.items()}}))
    """,
        TORCH_DEVICE_BACKEND_AUTOLOAD="0",
    )
    report = json.loads(out.splitlines()[-1])
    assert report["torch_tpu"] is False and report["devices"] == ["cpu"]
    assert report["values"] == expected


# ----------------------------------------------------------------------------- pickle / deepcopy
def test_pickle_tensors_and_modules():
    cpu = torch.randn(2, 3)
    tensor = pickle.loads(pickle.dumps(cpu.to(TPU)))
    assert tensor.device.type == "tpu" and torch.equal(tensor.cpu(), cpu)
    model = _model().to(TPU)
    clone = pickle.loads(pickle.dumps(model))
    assert_state_equal(clone.state_dict(), model.state_dict(), "tpu")
    parameter = pickle.loads(pickle.dumps(model[0].weight))
    assert isinstance(parameter, torch.nn.Parameter) and parameter.requires_grad


def test_deepcopy_tensor_keeps_sharing_within_the_copy():
    base = torch.arange(6.0, device=TPU).requires_grad_()
    pair = [base, base.detach()[2:]]
    copied = copy.deepcopy(pair)
    assert copied[0].requires_grad and copied[0].device.type == "tpu"
    assert torch.equal(copied[0].detach().cpu(), base.detach().cpu())
    assert copied[1]._cdata != pair[1]._cdata
    assert copied[0].untyped_storage()._cdata == copied[1].untyped_storage()._cdata
    assert copied[0].untyped_storage()._cdata != base.untyped_storage()._cdata
    with torch.no_grad():
        copied[0].mul_(10)
    assert copied[1].cpu().tolist() == [20.0, 30.0, 40.0, 50.0]
    assert base.detach().cpu().tolist() == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]


def test_deepcopy_module_is_independent():
    model = _model().to(TPU)
    clone = copy.deepcopy(model)
    assert_state_equal(clone.state_dict(), model.state_dict(), "tpu")
    before = model[0].weight.cpu()
    with torch.no_grad():
        clone[0].weight.fill_(7)
    assert torch.equal(model[0].weight.cpu(), before)
    assert clone[0].weight.requires_grad and clone[0].weight.device.type == "tpu"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64])
def test_saving_and_copying_tensors_of_new_shapes_compiles_nothing(dtype):
    """``torch.save`` reads each storage as bytes (a view in another dtype, reinterpreted on the
    host) and ``copy.deepcopy`` clones storages (the copy shares the immutable value): neither
    runs a program per shape. The copies stay independent of their sources."""
    cpus = [torch.arange(n * 3).reshape(n, 3).to(dtype) for n in range(41, 45)]
    tensors = [cpu.to(TPU) for cpu in cpus]
    stats = torch.tpu.compilation_cache_stats()
    before = stats["xla_compiles"] + stats["disk_hits"]
    saved = io.BytesIO()
    torch.save(tensors, saved)
    copies = copy.deepcopy(tensors)
    stats = torch.tpu.compilation_cache_stats()
    assert stats["xla_compiles"] + stats["disk_hits"] == before
    saved.seek(0)
    for loaded, copied, cpu in zip(torch.load(saved, map_location="cpu"), copies, cpus):
        assert loaded.dtype == dtype and torch.equal(loaded, cpu) and torch.equal(copied.cpu(), cpu)
    tensors[0].add_(1)
    copies[1].add_(1)
    assert torch.equal(copies[0].cpu(), cpus[0]) and torch.equal(tensors[1].cpu(), cpus[1])


# ----------------------------------------------------------------------------- safetensors
def test_safetensors_round_trip(tmp_path):
    cpu = {"w": torch.randn(3, 4), "h": torch.randn(5).bfloat16(), "i": torch.arange(4)}
    path = str(tmp_path / "t.safetensors")
    save_file({k: v.to(TPU) for k, v in cpu.items()}, path)
    assert_state_equal(load_file(path), cpu, "cpu")
    for device in ("tpu", "tpu:0", TPU):
        assert_state_equal(load_file(path, device=device), cpu, "tpu")
    with safe_open(path, framework="pt", device="tpu") as f:
        assert torch.equal(f.get_tensor("w").cpu(), cpu["w"])
        assert f.get_slice("w")[1:].device.type == "tpu"


@pytest.mark.parametrize("device", ["cpu", "tpu"])
def test_safetensors_sees_sharing_like_cpu(device, tmp_path):
    x = torch.arange(6.0, device=device)
    save_file({"a": x[:3], "b": x[3:]}, str(tmp_path / "halves.safetensors"))  # disjoint: fine
    with pytest.raises(RuntimeError, match="Some tensors share memory"):
        save_file({"a": x, "b": x}, str(tmp_path / "tied.safetensors"))
    model = torch.nn.Module()
    model.a = model.b = torch.nn.Linear(2, 2, device=device)  # tied: save_model keeps one name
    save_model(model, str(tmp_path / "model.safetensors"))
    assert sorted(load_file(str(tmp_path / "model.safetensors"))) == ["a.bias", "a.weight"]


def test_safetensors_rejects_other_tpu_indices(tmp_path):
    path = str(tmp_path / "t.safetensors")
    save_file({"w": torch.ones(2)}, path)
    with pytest.raises(RuntimeError, match="invalid device ordinal: tpu:1"):
        load_file(path, device="tpu:1")


# ----------------------------------------------------------------------------- storages
def test_storage_reports_its_size_and_copies():
    x = torch.arange(6, dtype=torch.int32, device=TPU) * 2  # a fresh op result
    storage = x.untyped_storage()
    assert storage.nbytes() == len(storage) == 24 and storage.size() == 24
    assert storage.device.type == "tpu" and storage.is_tpu
    # no host address: an opaque handle, shared by views, offset like host pointers
    assert storage.data_ptr() != 0 and x.data_ptr() == storage.data_ptr()
    assert x[2:].data_ptr() == storage.data_ptr() + 8
    assert (x * 1).untyped_storage().data_ptr() != storage.data_ptr()
    assert torch.UntypedStorage(0, device="tpu").data_ptr() == 0
    host = storage.cpu()
    assert host.device.type == "cpu"
    assert torch.equal(torch.empty(0, dtype=torch.int32).set_(host), x.cpu())
    back = host.tpu()
    assert back.is_tpu and back._cdata != storage._cdata
    assert torch.equal(torch.empty(0, dtype=torch.int32, device=TPU).set_(back).cpu(), x.cpu())
    cpu_target = torch.UntypedStorage(24)
    cpu_target.copy_(storage)
    assert bytes(cpu_target.tolist()) == bytes(host.tolist())


@pytest.mark.filterwarnings("ignore:TypedStorage is deprecated")
def test_storage_constructors_on_tpu():
    assert torch.UntypedStorage(8, device="tpu").nbytes() == 8
    assert torch.UntypedStorage(device="tpu").nbytes() == 0
    filled = torch.UntypedStorage([1, 2, 255], device="tpu")
    assert filled.is_tpu and filled.cpu().tolist() == [1, 2, 255]
    typed = torch.TypedStorage([1.5, 2.5], dtype=torch.float32, device="tpu")
    assert typed.is_tpu and typed.cpu().tolist() == [1.5, 2.5]
    with pytest.raises(RuntimeError, match="invalid device ordinal: tpu:1"):
        torch.UntypedStorage(8, device="tpu:1")
