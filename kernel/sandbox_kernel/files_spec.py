"""The ``sandbox_kernel.files`` comm's name and version: what both ends agree on.

The proxy answers the comm (:mod:`sandbox_kernel.files_comm`); its client
(:mod:`sandbox_kernel.client.files`) opens it.  Both import these from here, so
the client imports nothing of the proxy or of the agent's wire.  The message
shapes are in ``docs/files.md``.
"""

#: The comm target name (messaging spec, "Custom Messages": ``comm_open``'s ``target_name``).
TARGET = "sandbox_kernel.files"
#: Version of the message shapes (``hello`` carries it).
VERSION = 1
