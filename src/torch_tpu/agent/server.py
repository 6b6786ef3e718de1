"""The MCP server: torch_tpu's agent tools over stdio, for a coding agent porting and tuning a
PyTorch workload to tpu. Each tool runs in a process of its own (:mod:`.jobs`)."""

from __future__ import annotations

from . import jobs

INSTRUCTIONS = (
    "Tools to port a PyTorch workload from CUDA to torch_tpu and tune it. Start with doctor; "
    "find_cuda_code lists the CUDA-only lines (rewrite=true fixes the mechanical ones); "
    "layer_parity names the first module whose tpu output leaves float64's tolerance; profile "
    "runs a script under torch_tpu.diagnose (compiles, host syncs, device time, hints); "
    "tune_training / tune_generation measure the eager modes, torch.compile and matmul "
    "precision on the model and report the fastest correct setting. Models are named by entry "
    "points 'file.py:function' (a function of no arguments that builds them)."
)


def build():
    """The server, its tools registered."""
    from mcp.server.mcpserver import MCPServer

    server = MCPServer("torch_tpu", instructions=INSTRUCTIONS)

    @server.tool()
    def doctor() -> dict:
        """torch_tpu's install: platform and devices, versions, the C++ core, the compile cache,
        environment switches, and a self-test (ops vs CPU, a training step, a compile) with a
        verdict (exit_code 0: working)."""
        return jobs.run("doctor", {})

    @server.tool()
    def find_cuda_code(path: str, rewrite: bool = False) -> dict:
        """Scan a Python file or folder for CUDA-only code (.cuda(), torch.cuda.*, device="cuda",
        backend="nccl", GradScaler("cuda"), cuDNN flags, CUDA extensions); each finding as
        file:line with the tpu replacement. rewrite=true rewrites the mechanical ones in place."""
        return jobs.find_cuda_code(path, rewrite)

    @server.tool()
    def layer_parity(entry: str) -> dict:
        """Run a model on tpu and on CPU (float32 and float64) with forward hooks; name the first
        module whose tpu output is further from float64 than tolerance. entry: 'file.py:make',
        make() returns (model, inputs) on CPU."""
        return jobs.run("layer_parity", {"entry": entry})

    @server.tool()
    def profile(script: str, args: list[str] | None = None) -> dict:
        """Run a script under torch_tpu.diagnose: ops, CPU fallbacks, XLA compiles and why, host
        syncs with their lines, device time per op, hints; and an HTML report's path."""
        return jobs.run("profile", {"script": script, "args": args or []})

    @server.tool()
    def tune_training(entry: str, steps: int = 8) -> dict:
        """Train the model a few SGD steps under each setting (strict / fused eager,
        torch.compile, matmul precision 'highest' / 'high'); the fastest whose losses match
        float64's within tolerance. entry: 'file.py:make', make() returns (model, inputs) or
        (model, inputs, loss_fn) on CPU."""
        return jobs.run("tune_training", {"entry": entry, "steps": steps})

    @server.tool()
    def tune_generation(entry: str) -> dict:
        """Greedy generate() under each setting (strict / fused eager, matmul precision); the
        fastest whose tokens equal CPU's. entry: 'file.py:make', make() returns (a Hugging Face
        causal LM, input_ids, max_new_tokens) on CPU."""
        return jobs.run("tune_generation", {"entry": entry})

    return server


def main() -> None:
    build().run("stdio")
