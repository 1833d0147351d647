"""What the sandbox service and its clients share: where it listens, its protocol
version, and the fds of an answer (:mod:`sandbox_kernel.backends.local.service`)."""

from __future__ import annotations

#: The standard socket of the sandbox service (``LocalBackend.service_socket``).
SERVICE_SOCKET = "/run/sandbox-kernel/service.sock"
SERVICE_PROTOCOL = 1
#: Seconds a client waits for ``create``/``restore``/``checkpoint`` (runsc work).
SLOW_TIMEOUT_S = 120.0
#: fds of a ``create`` answer, and of a ``restore`` answer (no new watchdog).
CREATE_FDS = ("stdin", "stdout", "stderr", "watchdog", "pidfd")
RESTORE_FDS = ("stdin", "stdout", "stderr", "pidfd")
