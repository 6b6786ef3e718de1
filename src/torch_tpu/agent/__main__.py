"""``python -m torch_tpu.agent``: the MCP server on stdio (needs the ``mcp`` package:
``pip install torch_tpu[agent]``)."""

from .server import main

main()
