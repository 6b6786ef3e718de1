"""torch_tpu's agent suite: an MCP server (``python -m torch_tpu.agent``, stdio) whose tools a
coding agent uses to port a PyTorch workload to tpu and tune it, and the skill file that
describes the workflow (``SKILL.md`` beside this file). docs/profiling.md, "Agent suite".

- :mod:`.porting`: CUDA-only code and its replacements (rules as data);
- :mod:`.parity`: per-layer numerical parity against float64;
- :mod:`.tuning`: the settings tried and measured;
- :mod:`.jobs`: the tools as functions of JSON arguments, each run in a process of its own;
- :mod:`.server`: the MCP server registering them.
"""
