"""The agent suite: its tools called through the MCP SDK's own client over stdio
(``python -m torch_tpu.agent``), and the porting scanner on its own."""

from __future__ import annotations

import json
import sys
import textwrap

import anyio
import pytest

from torch_tpu.agent import porting

CUDA_SCRIPT = """
    import torch
    import torch.distributed as dist

    torch.backends.cudnn.benchmark = True  # CUDNN
    model = torch.nn.Linear(4, 4).cuda()  # DOT CUDA
    x = torch.randn(2, 4, device="cuda")  # DEVICE
    scaler = torch.amp.GradScaler("cuda")  # SCALER
    dist.init_process_group(backend="nccl")  # NCCL
    print(torch.cuda.device_count())  # API
"""

MODELS = """
    import torch

    class Planted(torch.nn.Module):
        def forward(self, x):  # on tpu only, an error of 1e-3
            return x + (1e-3 if x.device.type == "tpu" else 0.0)

    def planted():
        torch.manual_seed(0)
        layers = [torch.nn.Linear(16, 32), torch.nn.GELU(), Planted(), torch.nn.Linear(32, 4)]
        return torch.nn.Sequential(*layers), torch.randn(4, 16)

    def mlp():
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4))
        return model, torch.randn(8, 16)

    def llama():
        from transformers import LlamaConfig, LlamaForCausalLM

        torch.manual_seed(0)
        config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                             num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64)
        model = LlamaForCausalLM(config).eval()
        with torch.no_grad():  # (well separated logits: greedy tokens agree for the right reason)
            for p in model.parameters():
                if p.dim() > 1:
                    p.normal_(0.0, 0.3)
        return model, torch.tensor([[1, 5, 9, 3]]), 4
"""

PROFILED = """
    import torch
    import torch_tpu  # noqa: F401

    w = torch.ones(8, 8, device="tpu")
    for step in range(3):
        print((torch.ones(4, 8, device="tpu") @ w).sum().item())  # ITEM
"""


def _line(text: str, marker: str) -> int:
    return next(i for i, line in enumerate(textwrap.dedent(text).splitlines(), 1) if f"# {marker}" in line)


def test_scan_finds_each_kind_with_its_line_and_rewrites_the_mechanical_ones(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(CUDA_SCRIPT))
    found = porting.find_cuda_code(str(tmp_path))
    by_rule = {f["rule"]: f for f in found["findings"]}
    expected = {"cuDNN flag": "CUDNN", ".cuda()": "DOT CUDA", 'device="cuda"': "DEVICE"}
    expected |= {'GradScaler("cuda")': "SCALER", 'backend="nccl"': "NCCL", "torch.cuda API": "API"}
    for rule, marker in expected.items():
        assert by_rule[rule]["where"] == f"{script}:{_line(CUDA_SCRIPT, marker)}"
    assert by_rule["cuDNN flag"]["rewritten"] is None and found["by_hand"] == 1
    porting.find_cuda_code(str(script), rewrite=True)
    text = script.read_text()
    assert ".cuda()" not in text and 'device="tpu"' in text and 'backend="tpu_dist"' in text
    assert "torch.tpu.device_count()" in text and 'GradScaler("tpu")' in text
    assert [f["rule"] for f in porting.find_cuda_code(str(script))["findings"]] == ["cuDNN flag"]


def test_scan_of_a_missing_path_raises():
    with pytest.raises(FileNotFoundError, match="no file or folder"):
        porting.find_cuda_code("/nonexistent/path")


async def _call_each_tool(folder) -> dict:
    from mcp import ClientSession, StdioServerParameters
    from mcp.client.stdio import stdio_client

    params = StdioServerParameters(command=sys.executable, args=["-m", "torch_tpu.agent"], cwd=str(folder))
    calls = {
        "doctor": {},
        "find_cuda_code": {"path": str(folder / "train.py")},
        "layer_parity": {"entry": f"{folder / 'models.py'}:planted"},
        "tune_training": {"entry": f"{folder / 'models.py'}:mlp", "steps": 4},
        "tune_generation": {"entry": f"{folder / 'models.py'}:llama"},
        "profile": {"script": str(folder / "profiled.py")},
    }
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        listed = {tool.name for tool in (await session.list_tools()).tools}
        results = {"tools": listed}
        for name, arguments in calls.items():
            result = await session.call_tool(name, arguments, read_timeout_seconds=600)
            assert not result.is_error, result.content
            results[name] = json.loads(result.content[0].text)
    return results


def test_each_tool_through_the_mcp_client(tmp_path):
    for name, text in (("train.py", CUDA_SCRIPT), ("models.py", MODELS), ("profiled.py", PROFILED)):
        (tmp_path / name).write_text(textwrap.dedent(text))
    results = anyio.run(_call_each_tool, tmp_path)
    assert results["tools"] == {
        "doctor",
        "find_cuda_code",
        "layer_parity",
        "tune_training",
        "tune_generation",
        "profile",
    }
    assert results["doctor"]["exit_code"] == 0, results["doctor"]
    assert len(results["find_cuda_code"]["findings"]) == 6
    parity = results["layer_parity"]
    assert not parity["agrees"] and parity["first_divergent"]["module"] == "2"
    assert parity["first_divergent"]["kind"] == "Planted" and parity["first_divergent"]["tpu_error"] > 1e-4
    assert [m["diverges"] for m in parity["modules"][:2]] == [False, False]  # (before the planted one)
    for tuned in (results["tune_training"], results["tune_generation"]):
        assert tuned["best"] is not None, tuned
        assert all(t["seconds"] > 0 for t in tuned["trials"])
    assert len(results["tune_training"]["trials"]) == 6 and all(
        t["right"] for t in results["tune_training"]["trials"]
    )
    profiled = results["profile"]
    assert profiled["exit_code"] == 0
    assert f"item  at profiled.py:{_line(PROFILED, 'ITEM')}" in profiled["report"]
    assert open(profiled["html"]).read().startswith("<!DOCTYPE html>")


def test_the_skill_file_ships_with_the_package():
    from importlib import resources

    skill = resources.files("torch_tpu.agent").joinpath("SKILL.md").read_text()
    for tool in ("doctor", "find_cuda_code", "layer_parity", "profile", "tune_training", "tune_generation"):
        assert f"`{tool}" in skill
