"""The MCP server (``sandbox-kernel mcp``): a frontend of the kernel, through the agent client.

:mod:`.server` holds the tools (``FastMCP``, one kernel per MCP session),
:mod:`.http` the streamable HTTP transport (loopback only, a bearer token),
:mod:`.output` what a tool returns for a cell (pure: the capped transcript,
images, the summary).  Nothing here is imported by the package's ``__init__``:
the ``mcp`` SDK (the ``agents`` extra) is loaded only when the server runs.
Like :mod:`sandbox_kernel.client`, it speaks the Jupyter protocol, never the
agent's (``tests/test_imports.py``).
"""
