"""The sandbox service: root makes and drives gVisor sandboxes for ordinary users' kernels.

An ordinary user's kernel otherwise runs rootless gVisor (no cgroup: no CPU
limit; rootless runsc refuses ``restore``: no checkpoint).  ``sandbox-kernel
service``, run by root (a systemd unit: ``sandbox-kernel service
--install-unit``), gives it the full feature set while keeping users apart:

* It listens on :data:`SERVICE_SOCKET` (mode 0666: any local user may connect).
  Every request is one JSON line, answered by one JSON line (fds attached with
  ``SCM_RIGHTS`` where named), as the warm pool's wire (:mod:`.wire`): ``ok`` true,
  or ``ok`` false with its ``reason`` and, where the service refused rather than
  failed (a check, a bound, a bad id), ``refused`` true.  Each request is
  authorised by the peer's uid as the kernel recorded it (``SO_PEERCRED``),
  never by anything the client says.
* ``create`` (policy fields, kernel id, python path): the service checks, *as
  the peer* (a process run with the peer's uid, gid and groups), that the
  interpreter runs, that every host directory the sandbox would mount (the
  interpreter's environment, ``ro_paths``) is readable by the peer, and that
  nothing in the interpreter's environment is the peer's or writable by it (the
  sandbox's agent runs that interpreter as the sandbox's root), then makes
  the sandbox as root with the local backend's own code
  (:meth:`.sandbox.LocalSandbox.create`: cgroup limits, watchdog), records the
  **owner uid** (and the peer's pid as ``proxy_pid``, for ``gc``) in its
  ``tag.json``, and hands over the runtime's stdin/stdout/stderr pipe ends, the
  watchdog's arming pipe and a pidfd, as the pool's ``take`` does.
  ``network=allowlist`` and ``ro_paths`` are refused.
* **The user's own folder** (``workspace`` ``ro``/``rw``): the proxy opens it, as the
  user (``O_RDONLY | O_DIRECTORY | O_NOFOLLOW``), and passes the fd with the
  ``create`` (``SCM_RIGHTS``); root never opens a path the peer names.  The service
  takes it only if it is a directory opened for reading and owned by the peer's uid
  (:func:`.peers.peer_folder`), and binds it only through an id-mapped clone made
  from that fd (:func:`..idmap.stage_folder`: the peer's uid and gid on disk are the
  sandbox user's; no other user's file is mapped, so each keeps its "other" bits
  against every process of the sandbox, the agent included); a folder that cannot be
  id-mapped is refused, never bound as it is.  The fd is kept for the sandbox's life,
  so a restore maps the same folder again; the proxy passes it again with each
  ``restore``, which a service started since (it holds none) takes if it is the very
  folder of the ``create`` (device and inode recorded), and refuses otherwise.
* ``pause``, ``resume``, ``checkpoint``, ``restore`` (new fds: the restored
  runtime process's pipes and pidfd) and ``kill`` name a container id; they are
  refused unless the id names a sandbox this service made whose owner uid is
  the peer's (root may do all).
* ``snapshot``, ``fork`` (a container id of the peer's) and ``remove_snapshots``, and a
  ``create`` naming ``from`` (a snapshot id or a fork's hand-off): snapshots, rewinds and
  forks of the peer's kernels (issue 30), the images root's in the service's own state,
  each id looked up among the peer's own only (:mod:`.copies`).
* The service ends a sandbox at its cgroup's first OOM kill (the owner cannot
  write the cgroup); the owner reads the cgroup's counters to name the cause.
* A service that was killed (not stopped) takes back, when it starts again, the
  sandboxes it made that are still there (:meth:`SandboxService.recover`).
* **Warm pool** (``--pool-size N`` with the kernels' policy flags and ``--python``):
  the service keeps ``N`` sandboxes started for that policy and interpreter, owned
  by nobody and never run code.  A ``create`` whose policy key
  (:func:`.wire.policy_key`) and interpreter match, after the same checks as the
  peer as a cold one, takes one: its owner becomes the peer's uid, its ``tag.json``
  names the kernel, and it goes to that one kernel only (popped before anything
  else can ask); a replacement starts at once.  A kernel of another policy starts
  cold, whoever asks.

State directories stay root's (the state base 0711, a sandbox's directory,
its checkpoint image and runsc root 0700).  The proxy holds the only
write end of the watchdog's pipe: if it dies, the watchdog (root's) reaps the
sandbox.  Stopping the service removes the sandboxes it still holds.

The package, by process and concern: :mod:`.wire` (the socket, the protocol
version, the fds of an answer: what both sides share), :mod:`.peers` (every check
of what a peer may ask, run as the peer where it touches files), :mod:`.server`
(``sandbox-kernel service``: :class:`.server.SandboxService`), :mod:`.copies` (its
snapshots and fork hand-offs), :mod:`.client` (the kernel's side:
:class:`.client.ServiceRuntime`) and :mod:`.copy_client` (the kernel's snapshot and fork requests).
"""
