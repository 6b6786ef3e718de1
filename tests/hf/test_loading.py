"""``save_pretrained`` then ``from_pretrained`` onto tpu: ``device_map="tpu"``, ``.to("tpu")``,
and ``dtype=torch.bfloat16``; safetensors straight onto the device."""

from __future__ import annotations

import pytest
import safetensors.torch
import torch
import transformers

from torch_tpu.testing import hf_zoo


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    model = hf_zoo.build("llama")
    directory = tmp_path_factory.mktemp("tiny-llama")
    model.save_pretrained(directory)
    return model, directory


def _logits(model, device):
    feed = {k: v.to(device) for k, v in hf_zoo.inputs("llama").items()}
    with torch.no_grad():
        return model(**feed).logits.cpu()


def _assert_on(model, device: str, dtype: torch.dtype):
    places = {(p.device.type, p.dtype) for p in model.parameters()}
    assert places == {(device, dtype)}, places


@pytest.mark.parametrize("how", ["device_map", "to"])
def test_loads_onto_tpu(saved, how):
    reference, directory = saved
    if how == "device_map":
        model = transformers.AutoModelForCausalLM.from_pretrained(directory, device_map="tpu")
    else:
        model = transformers.AutoModelForCausalLM.from_pretrained(directory).to("tpu")
    _assert_on(model, "tpu", torch.float32)
    torch.testing.assert_close(_logits(model, "tpu"), _logits(reference, "cpu"), rtol=1e-5, atol=1e-5)


def test_loads_bfloat16(saved):
    _, directory = saved
    model = transformers.AutoModelForCausalLM.from_pretrained(
        directory, device_map="tpu", dtype=torch.bfloat16
    )
    _assert_on(model, "tpu", torch.bfloat16)
    cpu = transformers.AutoModelForCausalLM.from_pretrained(directory, dtype=torch.bfloat16)
    for name, weight in cpu.state_dict().items():  # the same bits, not a re-rounding
        assert torch.equal(model.state_dict()[name].cpu(), weight), name
    tpu_logits, cpu_logits = _logits(model, "tpu").float(), _logits(cpu, "cpu").float()
    scale = cpu_logits.abs().max()
    assert (tpu_logits - cpu_logits).abs().max() <= 0.05 * scale  # bf16 rounds differently


def test_safetensors_load_straight_onto_tpu(tmp_path):
    tensors = {"weight": torch.randn(3, 4), "half": torch.randn(5).bfloat16()}
    path = tmp_path / "t.safetensors"
    safetensors.torch.save_file(tensors, path)
    loaded = safetensors.torch.load_file(path, device="tpu")
    for name, tensor in tensors.items():
        assert loaded[name].device.type == "tpu"
        assert torch.equal(loaded[name].cpu(), tensor)
