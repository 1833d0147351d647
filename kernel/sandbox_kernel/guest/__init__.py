"""What runs INSIDE the sandbox, on the untrusted side of the boundary.

This folder holds the code every backend ships into its sandbox:

* ``agent.py``: the agent (one file, standard library, ``zmq`` and
  ``jupyter_client`` only), which starts a stock ipykernel and relays it over
  stdio; ``docs/security.md`` draws the boundary;
* ``statx_shim.c``: a small ``LD_PRELOAD`` library the gVisor runtime builds on
  the host and preloads inside (:func:`sandbox_kernel.backends.local.gvisor.statx_shim`).

Nothing in this folder imports from the host package (``tests/test_guest.py``
holds it to that).  This ``__init__`` is the host's lookup only: where the
files are on the host and where they go inside.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

#: Where the agent is placed inside a local or Modal sandbox (E2B uploads it elsewhere).
AGENT_PATH = "/opt/sandbox-kernel/agent.py"
#: Where the workspace (``SandboxKernel.workspace``) appears inside every sandbox, and the
#: interpreter's working directory when there is one (``docs/decisions.md``).
WORKSPACE_DIR = "/home/sandbox/work"
#: Where a local sandbox finds the host-built jedi cache, read-only (the agent's
#: ``JEDI_SEED_DIR``; :mod:`sandbox_kernel.backends.local.jedi_cache`).
JEDI_SEED_PATH = "/opt/sandbox-kernel/jedi-cache"
#: Where a local sandbox with ``network=allowlist`` finds its kernel's egress proxy socket
#: (``proxy.sock``), read-only (:mod:`sandbox_kernel.egress.server`).
EGRESS_DIR = "/opt/sandbox-kernel/egress"
#: The port on the sandbox's own loopback where the agent forwards to that socket:
#: ``HTTP_PROXY=http://127.0.0.1:3128`` inside.
EGRESS_PORT = 3128
#: Where ``pip install`` inside a sandbox with egress puts packages (``PIP_PREFIX``),
#: on the scratch space; importable at once (the read-only environment stays untouched).
PIP_PREFIX = "/home/sandbox/.local"


def agent_source_path() -> str:
    """Host path of ``agent.py``, the file shipped into every sandbox."""
    return str(Path(__file__).resolve().parent / "agent.py")


def statx_shim_source() -> bytes:
    """The C source of the statx shim (``statx_shim.c``), as shipped in the package."""
    return resources.files(__name__).joinpath("statx_shim.c").read_bytes()
