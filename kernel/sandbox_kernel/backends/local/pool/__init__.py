"""The warm pool: sandboxes started ahead of time, handed to new kernels over a unix socket.

:mod:`.daemon` (``sandbox-kernel pool``) keeps them, :mod:`.client` takes one
for a proxy, :mod:`.wire` is what both share.
"""
