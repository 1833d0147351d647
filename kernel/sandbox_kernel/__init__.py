"""sandbox-kernel: a Jupyter kernel proxy serving a stateful interpreter in a sandbox.

The host-side proxy (:mod:`sandbox_kernel.proxy`) is an ipykernel ``Kernel``
subclass that relays every Jupyter message to a stock ipykernel running inside
a disposable sandbox (:mod:`sandbox_kernel.backends`).  Importing this package
imports neither the E2B nor the Modal SDK.
"""

__version__ = "0.1.0"

__all__ = ["AsyncSandbox", "Sandbox"]


def __getattr__(name: str):
    """``Sandbox`` and ``AsyncSandbox`` (:mod:`sandbox_kernel.client`), imported on first use
    so that importing the package stays light."""
    if name in ("Sandbox", "AsyncSandbox"):
        from . import client

        return getattr(client, name)
    raise AttributeError(f"module 'sandbox_kernel' has no attribute {name!r}")
