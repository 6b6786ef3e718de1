"""The agent's tools as plain functions of JSON-able arguments, each run in a process of its own
by the server (``python -m torch_tpu.agent.jobs TOOL ARGS_JSON`` prints the result as JSON on
its last line), so a tool that crashes or hangs on the user's code leaves the server standing.

A model is named by an entry point, ``"path/to/file.py:function"`` or ``"package.module:function"``:
a function of no arguments that builds it (see each tool for what it returns).
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable


def resolve(entry: str) -> Callable:
    """The function an entry point names."""
    where, _, name = entry.rpartition(":")
    if not where or not name:
        raise ValueError(f"an entry point is 'file.py:function' or 'module:function', got {entry!r}")
    if where.endswith(".py"):
        if not os.path.isfile(where):
            raise FileNotFoundError(f"no file {where!r} (entry point {entry!r})")
        sys.path.insert(0, os.path.dirname(os.path.abspath(where)))
        spec = importlib.util.spec_from_file_location("_agent_entry", where)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    else:
        module = importlib.import_module(where)
    return getattr(module, name)


def doctor() -> dict:
    """``python -m torch_tpu doctor --json``: the install's report and its verdict."""
    done = subprocess.run(
        [sys.executable, "-m", "torch_tpu", "doctor", "--json"], capture_output=True, text=True, timeout=600
    )
    return {"exit_code": done.returncode, "report": json.loads(done.stdout)}


def find_cuda_code(path: str, rewrite: bool = False) -> dict:
    from .porting import find_cuda_code as scan

    return scan(path, rewrite)


def layer_parity(entry: str) -> dict:
    """``entry`` builds ``(model, inputs)``."""
    from .parity import layer_parity as parity

    return parity(resolve(entry))


def tune_training(entry: str, steps: int = 8) -> dict:
    """``entry`` builds ``(model, inputs)`` or ``(model, inputs, loss_fn)``."""
    from .tuning import tune_training as tune

    return tune(resolve(entry), steps)


def tune_generation(entry: str) -> dict:
    """``entry`` builds ``(model, input_ids, max_new_tokens)``."""
    from .tuning import tune_generation as tune

    return tune(resolve(entry))


def profile(script: str, args: list[str] | None = None) -> dict:
    """Run ``script`` under ``python -m torch_tpu.diagnose --html``: its exit code, the report's
    text and the HTML page's path."""
    page = os.path.join(tempfile.mkdtemp(prefix="torch_tpu_profile_"), "report.html")
    command = [sys.executable, "-m", "torch_tpu.diagnose", "--html", page, script, *(args or [])]
    folder = os.path.dirname(os.path.abspath(script))
    done = subprocess.run(command, capture_output=True, text=True, cwd=folder, timeout=3600)
    report = done.stderr[done.stderr.find("torch_tpu diagnosis:") :]
    return {"exit_code": done.returncode, "report": report, "html": page, "stdout_tail": done.stdout[-2000:]}


TOOLS: dict[str, Callable[..., dict]] = {
    f.__name__: f for f in (doctor, find_cuda_code, layer_parity, tune_training, tune_generation, profile)
}


def run(tool: str, arguments: dict, timeout: float = 3600) -> dict:
    """``tool(**arguments)`` in a process of its own: its result, or ``{"error": ...}``."""
    command = [sys.executable, "-m", "torch_tpu.agent.jobs", tool, json.dumps(arguments)]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"{tool} did not finish within {timeout:.0f} s"}
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        return {"error": f"{tool} failed (exit code {done.returncode})", "stderr_tail": done.stderr[-4000:]}
    return json.loads(lines[-1])


def main(argv: list[str]) -> int:
    tool, arguments = argv[0], json.loads(argv[1]) if len(argv) > 1 else {}
    try:
        result = TOOLS[tool](**arguments)
    except Exception as error:  # (reported to the agent, with its type)
        result = {"error": f"{type(error).__name__}: {error}"}
    print(json.dumps(result, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
