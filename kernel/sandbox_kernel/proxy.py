"""The proxy kernel: an ipykernel ``Kernel`` subclass that relays to a sandbox.

Heartbeat, control, signing and status come from ipykernel.  Every shell
request is relayed at message level to a stock ipykernel inside the sandbox
(:mod:`sandbox_kernel.relay`); replies and IOPub messages come back through the
output firewall and are re-signed with the frontend's key, which the sandbox
never holds.  Interrupts arrive as ``interrupt_request`` on the control
channel (kernelspec ``interrupt_mode: message``) and become SIGINT inside.

Messaging spec references are to "Messaging in Jupyter" (protocol 5.4).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import platform
import threading
import uuid
from typing import Any

import zmq
from ipykernel.kernelbase import Kernel
from jupyter_client.session import Session

from . import __version__, features, magics, workspace
from .aio import InHand, background
from .backends.base import SandboxBackend
from .cells import Cells, error_line
from .dispatch import OwnParentDispatch
from .errors import AdmissionRefused, KernelRewound, KernelShuttingDown, NoReply, SandboxDied, SandboxKernelError
from .features import Debugger
from .files import FileTransfers
from .files_comm import FilesComm
from .interpreter_config import SetupRunner
from .lifecycle import IdleLifecycle
from .options import KernelOptions
from .policy import Policy
from .protocol import AgentFrame
from .relay import SHUTTING_DOWN, Pending, Relay
from .sandbox_state import LifecycleEvent
from .snapshots import REQUESTS as SNAPSHOT_REQUESTS
from .snapshots import Snapshots
from .subshells import Subshells
from .usage import SandboxUsage
from .workspace_copy import WorkspaceCopy

log = logging.getLogger("sandbox_kernel")

#: Shell requests relayed with a reply expected (messaging spec, "Messages on the shell channel").
RELAYED_REQUESTS = ("execute_request", "complete_request", "inspect_request", "history_request",
                    "is_complete_request", "comm_info_request")
#: Comm messages: relayed both ways, no reply (spec, "Custom Messages").
RELAYED_COMMS = ("comm_open", "comm_msg", "comm_close")
#: Seconds a shutdown waits for the shell requests already received to be answered
#: (jupyter_client sends SIGTERM 2.5 s after ``shutdown_request``).
SHELL_DRAIN_S = 1.0
#: IOPub types never relayed: status is the proxy's own, the rest are the inner kernel's business.
DROPPED_IOPUB = frozenset({"status", "shutdown_reply"})


class SandboxKernel(KernelOptions, OwnParentDispatch, Kernel):
    """Jupyter kernel whose interpreter runs in a sandbox.

    Configure with traitlets, e.g. kernelspec argv
    ``--SandboxKernel.backend=local --SandboxKernel.memory_mib=2048
    --LocalBackend.runtime=gvisor``; the options are :class:`~.options.KernelOptions`'
    (the policy's and the kernel's own) and the backend class's.  Each request's
    ``status`` keeps its own parent however requests overlap (:mod:`.dispatch`).

    The parts beside it (:attr:`cells`, :attr:`subshells`, :attr:`debugger`, :attr:`usage`,
    :attr:`files_comm`, :attr:`interpreter_setup`) see it as a :class:`~.kernel_face.KernelFace`.
    """

    implementation = "sandbox_kernel"
    implementation_version = __version__
    banner = "Python in a sandbox (sandbox-kernel)"
    language_info = {
        "name": "python",
        "mimetype": "text/x-python",
        "file_extension": ".py",
        "codemirror_mode": {"name": "ipython", "version": 3},
        "pygments_lexer": "ipython3",
        # the proxy's own until the sandbox's interpreter answers (the local backend's default)
        "version": platform.python_version(),
        "nbconvert_exporter": "python",
    }

    def __init__(self, **kwargs: Any):
        super().__init__(**kwargs)
        # The control channel accepts every shell request type (messaging spec 5.x,
        # "Control"); both run the same handlers, which hop to the main loop.
        for name in RELAYED_REQUESTS:
            self.shell_handlers[name] = self.control_handlers[name] = self._relay_request
        for name in RELAYED_COMMS:  # on control too: the file comm is served while a cell runs
            self.shell_handlers[name] = self.control_handlers[name] = self._relay_comm
        self.debugger = Debugger(self)
        self.control_handlers["debug_request"] = self.debugger.request
        self.subshells = Subshells(self)
        self.control_handlers["create_subshell_request"] = self.subshells.create_request
        self.control_handlers["delete_subshell_request"] = self.subshells.delete_request
        self.control_handlers["list_subshell_request"] = self.subshells.list_request
        self.control_handlers["interrupt_request"] = self.interrupt_request
        self.usage = SandboxUsage(self)
        self.control_handlers["usage_request"] = self.usage.request  # the sandbox's, not the host's
        self.cells = Cells(self, self.usage)
        self.snapshots = Snapshots(self, self.snapshots_max, self.forks_max)  # snapshot, restore (rewind), list
        for name in SNAPSHOT_REQUESTS:  # and fork
            self.control_handlers[name] = getattr(self.snapshots, name)
        self.kernel_id = uuid.uuid4().hex
        self.sandbox: SandboxBackend | None = None
        #: Why the configuration cannot work (a bad option): every request is answered
        #: with it, instead of the kernel process dying where no user sees why.
        self.config_error: str | None = None
        self.policy = Policy()  # kept only if the configuration is bad: then no sandbox starts
        self.files_comm = FilesComm(self)
        #: The host folder a workspace would expose (for the hint after FileNotFoundError).
        self._host_folder = ""
        try:
            self.policy = self.build_policy()
            cwd = os.getcwd()
            self._host_folder = os.path.realpath(self.policy.workspace_path or cwd)
            self.policy = workspace.resolve(self.policy, cwd)
            self.sandbox = self.build_backend(self.policy, self.kernel_id, log)
        except SandboxKernelError as err:
            self.config_error = f"{err}. Fix the kernelspec or the configuration, then restart the kernel"
            log.error("configuration error: %s", err)
        if self.sandbox is not None:
            self.warn_unenforced(self.policy, self.sandbox, log)
            self.sandbox.egress_log.observe(self.cells.last_execute_id, self.cells.show_egress_denial)
        from .outputs import OutputFirewall

        self.firewall = OutputFirewall(self.policy.output_policy, self.policy.trusted_widget_modules,
                                       self.policy.trusted_comm_targets)
        self.relay: Relay | None = None
        #: The copied workspace of a backend that cannot mount it (made by start_sandbox).
        self.workspace_copy: WorkspaceCopy | None = None
        self.lifecycle: IdleLifecycle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._start_task: asyncio.Task | None = None
        self._start_error: str | None = self.config_error
        self._started_once = False
        #: The host's IPython configuration for the interpreter (issue 18 item 9), applied
        #: once per fresh interpreter before the first request reaches it.
        self.interpreter_setup = SetupRunner(self, self.collect_interpreter_setup(log))
        #: Set first thing by :meth:`do_shutdown`: requests still queued are refused.
        self._shutting_down = False
        self._shell_in_hand = InHand()

    @property
    def _relay(self) -> Relay:
        """The relay: made by :meth:`start_sandbox`, before any request is handled."""
        assert self.relay is not None, "start_sandbox() makes the relay before requests come"
        return self.relay

    @property
    def _session(self) -> Session:
        assert self.session is not None, "ipykernel sets the session before the kernel starts"
        return self.session

    # ---- start ------------------------------------------------------------------

    def start(self) -> None:
        super().start()
        self.start_sandbox()

    def start_sandbox(self) -> None:
        """Create the relay and the idle timer and start the first sandbox in the background.

        Called by :meth:`start` once ipykernel's streams exist (the tests' in-process
        harness calls it directly); must run on the proxy's main loop.
        """
        self._loop = asyncio.get_event_loop()
        if self.sandbox is None:  # a bad configuration: every request says so (ready)
            return
        self.relay = Relay(self.sandbox, self, max_frame_bytes=self.policy.max_frame_bytes, log=log,
                           ping_after_s=self.ping_after_s, pong_timeout_s=self.pong_timeout_s)
        self.relay.files = FileTransfers(self.relay, self.policy.max_file_transfer_bytes)
        if self.policy.workspace != "none" and not self.sandbox.workspace_mount:
            self.workspace_copy = WorkspaceCopy(self.relay.files, self.policy, log)
        self.lifecycle = IdleLifecycle(self.relay, self.policy, log)
        self.lifecycle.start()
        self._start_task = asyncio.ensure_future(self._first_start())

    async def _first_start(self) -> None:
        try:
            await self._relay.start()
            if self._relay.settle_needed:  # a fork of a kernel running a cell: that cell ends first
                self._relay.settle_needed = False
                await self.snapshots.settle(self._relay)
        except KernelShuttingDown:
            log.info("the kernel was shut down before its first sandbox was up")
        except SandboxKernelError as err:
            self._start_error = str(err)
            log.error("sandbox start failed: %s", err)

    async def ready(self) -> str | None:
        """Wait for the sandbox; return a notice for the user, if any (:class:`.KernelFace`).

        Raises
        ------
        SandboxKernelError
            If no sandbox can be started, or the configuration is bad.
        """
        if self.config_error is not None:
            raise SandboxKernelError(self.config_error)
        if self._shutting_down:
            raise KernelShuttingDown(SHUTTING_DOWN)
        if self._start_task is not None and not self._start_task.done():
            await asyncio.shield(self._start_task)
        notice = await self._relay.ensure_running()
        if self.workspace_copy is not None:  # E2B, Modal: a copy of the workspace, once per sandbox
            await self.workspace_copy.ensure()
        if self.interpreter_setup.needed:  # after each fresh interpreter (.interpreter_config)
            failed = await self.interpreter_setup.apply()
            if failed:
                self.cells.note(failed)
        self._start_error = None
        return notice

    # ---- relaying -------------------------------------------------------------------

    async def on_main_loop(self, coro: Any) -> Any:
        """Await ``coro`` on the proxy's main loop from whichever loop calls (:class:`.KernelFace`).

        Control requests run on ipykernel's control thread, whose loop is not
        the one the relay lives on (awaiting a main-loop future there raises
        ``ValueError: The future belongs to a different loop``).
        """
        if self._loop is None or asyncio.get_running_loop() is self._loop:
            return await coro
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, self._loop))

    async def _relay_request(self, stream, ident, parent) -> None:
        """Handler of every relayed request type, on the shell or the control channel."""
        channel = "control" if stream is self.control_stream else "shell"
        reply_type, content, md = await self.on_main_loop(self.relayed_reply(ident, parent, channel))
        if (reply_type == "execute_reply" and content.get("status") == "error"
                and parent["content"].get("stop_on_error", True) and stream is not self.control_stream):
            # that subshell's queue only; before the reply: a cell sent once it is seen runs
            self._abort_queues(parent["header"].get("subshell_id"))
        self.send_reply(stream, reply_type, content, parent, ident, metadata=md)

    async def relayed_reply(self, ident, parent, channel: str) -> tuple[str, dict, dict]:
        """Relay ``parent`` to the inner kernel's ``channel``; return ``(reply_type, content,
        metadata)`` (:class:`.KernelFace`)."""
        msg_type = parent["header"]["msg_type"]
        reply_type = msg_type.replace("_request", "_reply")
        is_execute = msg_type == "execute_request"
        magic = magics.match(parent["content"].get("code")) if is_execute and channel == "shell" else None
        if magic is not None:  # %snapshot, %snapshots, %rewind: the proxy's, never the sandbox's
            return reply_type, await magics.run(self, self.snapshots, parent, *magic, self._last_count()), {}
        try:
            notice = await (self.cells.ready_with_progress(parent) if is_execute and self.lifecycle_notices
                            else self.ready())
        except SandboxKernelError as err:
            lost = self._relay.state_notice if self.relay is not None else None
            if lost and is_execute:  # state was lost and no sandbox came back: both are said
                self.send_stderr(parent, lost)
            # AdmissionRefused: the resource and the numbers as fields, for agents
            extra = {"admission": err.details} if isinstance(err, AdmissionRefused) else None
            return reply_type, self._error_reply(parent, reply_type, getattr(err, "ename", "SandboxUnavailable"),
                                                 f"{err}", publish=is_execute, extra=extra), {}
        if notice and is_execute:
            self.send_stderr(parent, notice)
        notes = self.cells.take_notices()
        if is_execute and self.lifecycle_notices:
            for n in notes:
                self.send_stderr(parent, n)
        msg_id = str(parent["header"]["msg_id"])
        if is_execute:  # before the request goes out: its first output may come at once
            self.cells.begin(parent)
        try:
            header = await self.subshells.inner_header(parent) if channel == "shell" else None
            p = await self._relay.send_request(channel, parent, ident, header=header)
            timer = self.cells.arm_timeout(p) if is_execute else None
            try:
                reply = await self._relay.wait(p)
            finally:
                if timer is not None:
                    timer.cancel()
        except SandboxDied as err:
            self.cells.drop(msg_id)
            if isinstance(err, KernelRewound):  # ended as an interrupt would: its own error
                return reply_type, self._error_reply(parent, reply_type, err.ename, str(err), publish=is_execute), {}
            if self._shutting_down:  # a shutdown or restart the frontend asked for, not a crash
                return reply_type, self._error_reply(
                    parent, reply_type, KernelShuttingDown.ename,
                    "the kernel is shutting down (a shutdown or restart was requested): this cell was "
                    "stopped", publish=is_execute), {}
            evalue = (f"the interpreter stopped: {err.cause}. It was restarted: variables and imports "
                      "are gone; re-run the cells you need.")
            return reply_type, self._error_reply(parent, reply_type, "SandboxRestarted", evalue,
                                                 publish=is_execute), {}
        except NoReply as err:
            self.cells.drop(msg_id)
            return reply_type, self._error_reply(parent, reply_type, "NoReplyFromSandbox", str(err),
                                                 publish=is_execute), {}
        assert reply is not None  # requests (not comms) always have one
        content, notes = self.firewall.filter_reply(reply_type, dict(reply.content))
        for n in notes:
            if is_execute:  # a page payload: shown in the cell
                self.send_stderr(parent, n)
            else:  # inspect_reply: no cell to show it in
                log.info("%s", n)
        metadata = reply.metadata
        if is_execute:
            content, metadata = self.cells.finish(p, content, metadata)
        return reply_type, content, metadata

    async def _relay_comm(self, stream, ident, parent) -> None:
        """Handler of comm messages on shell and control: the file comm is answered here
        (:mod:`.files_comm`), every other comm is relayed to the sandbox."""
        await self.on_main_loop(self._comm(ident, parent))

    async def _comm(self, ident, parent) -> None:
        if self.files_comm.claims(parent["header"]["msg_type"], parent.get("content") or {}):
            await self.files_comm.handle(parent)
            return
        # Before relaying: the sandbox's answers on a comm the frontend opened (the widget
        # control comm, asked for every widget's state after a page reload) are filtered by
        # its target like any other.
        self.firewall.observe_frontend(parent["header"]["msg_type"], parent.get("content") or {},
                                       parent.get("buffers"))
        try:
            await self.ready()
            header = await self.subshells.inner_header(parent)  # widget managers use subshells
            p = await self._relay.send_request("shell", parent, ident, expect_reply=False, header=header)
            await self._relay.wait(p)
        except SandboxKernelError as err:
            log.warning("comm message not delivered: %s", err)

    def _error_reply(self, parent, reply_type, ename, evalue, publish, extra: dict | None = None) -> dict:
        """An error reply's content (messaging spec, "Request Reply"); with ``publish``,
        also the IOPub ``error`` a frontend shows in the cell."""
        content = {"status": "error", "ename": ename, "evalue": evalue, "traceback": [error_line(ename, evalue)],
                   **(extra or {})}
        if publish:
            self.publish("error", content, parent)
        if reply_type == "execute_reply":
            content = {**content, "execution_count": self._last_count(), "user_expressions": {},
                       "payload": []}
        return content

    def _last_count(self) -> int:
        return int(getattr(self, "_exec_count", 0))

    # ---- what the parts send and use (KernelFace) ------------------------------------

    def publish(self, msg_type: str, content: dict[str, Any], parent: dict[str, Any], *,
                topic: str | None = None, metadata: dict[str, Any] | None = None,
                buffers: list[Any] | None = None) -> None:
        """Sign and send one IOPub message under ``parent`` (:class:`.KernelFace`)."""
        self._session.send(self.iopub_socket, msg_type, content, parent, ident=self._topic(topic or msg_type),
                           metadata=metadata, buffers=buffers)

    def send_stderr(self, parent: dict[str, Any], text: str) -> None:
        """``text`` as ``parent``'s stderr stream, ending with one newline (:class:`.KernelFace`)."""
        # Not ``_stderr``: ipykernel's Kernel.__init__ sets ``self._stderr = sys.stderr``,
        # which shadowed the method and made every notice raise TypeError.
        self.publish("stream", {"name": "stderr", "text": text.rstrip("\n") + "\n"}, parent)

    def forget_notice(self, text: str) -> None:
        """Drop a notice kept for the next cell (:class:`.KernelFace`)."""
        self.cells.forget(text)

    def send_reply(self, stream: Any, msg_type: str, content: dict[str, Any], parent: dict[str, Any],
                   ident: Any, *, metadata: dict[str, Any] | None = None) -> None:
        """Sign and send a reply on ``stream``, routed to ``ident`` (:class:`.KernelFace`)."""
        self._session.send(stream, msg_type, content, parent, ident, metadata=metadata)

    def new_message(self, msg_type: str, content: dict[str, Any],
                    parent: dict[str, Any] | None = None) -> dict[str, Any]:
        """A new message of the proxy's own session (:class:`.KernelFace`)."""
        return self._session.msg(msg_type, content, parent=parent)

    def inner_features(self) -> list[str]:
        """The inner kernel's ``supported_features`` this relay carries (:class:`.KernelFace`,
        :func:`.features.carried`)."""
        return features.carried(self.relay.kernel_info if self.relay else None, self._supports_kernel_subshells)

    def own_subshells(self, request: dict[str, Any]) -> dict[str, Any] | None:
        """Create, delete or list the proxy's own subshells (:class:`.KernelFace`): ipykernel's
        subshell manager, through its control-to-shell-channel socket, as ipykernel's own
        handlers do; None without subshells."""
        if not self._supports_kernel_subshells:
            return None
        sock = self.shell_channel_thread.manager.control_to_shell_channel.from_socket
        sock.send_json(request)
        return dict(sock.recv_json())

    # ---- RelayHost ------------------------------------------------------------------

    def on_iopub(self, frame: AgentFrame, pending: Pending | None) -> None:
        """Publish one IOPub message of the sandbox: with its request's parent, through the
        output firewall and the cell's output budget, re-signed with the frontend's key."""
        msg_type = frame.msg_type
        if msg_type is None or msg_type in DROPPED_IOPUB:
            return
        if self.interpreter_setup.takes(frame, pending):  # the IPython setup's own: the log
            return
        parent = self.cells.parent_of(pending, frame.parent_msg_id)  # output after its cell ended too
        content = frame.content
        if msg_type in ("execute_input", "execute_result") and isinstance(content.get("execution_count"), int):
            self._exec_count = content["execution_count"]
        if msg_type in ("display_data", "update_display_data", "execute_result"):
            content, notes = self.firewall.filter(msg_type, content)
            for n in notes:
                self.send_stderr(parent, n)
            if msg_type == "display_data" and notes and content.get("data") == {"text/plain": notes[0]}:
                return  # nothing of it left (display(Javascript(...))): the stderr notice says so, once
        buffers = frame.buffers
        if msg_type in RELAYED_COMMS and self.files_comm.claims_from_sandbox(msg_type, content):
            log.warning("dropped a %s from the sandbox posing as the file comm", msg_type)
            return
        if msg_type in RELAYED_COMMS:
            filtered, buffers, notes = self.firewall.filter_comm(msg_type, content, buffers)
            for n in notes:
                self.send_stderr(parent, n)
            if filtered is None:
                return
            content = filtered
        admitted = self.cells.admit(pending, msg_type, content, buffers)  # the cell's budget
        if admitted is None:
            return
        content = admitted
        self.publish(msg_type, content, parent, metadata=frame.metadata, buffers=list(buffers) or None)
        if msg_type == "error":
            boundary = self.sandbox.capabilities.boundary if self.sandbox is not None else ""
            hint = workspace.error_hint(self.policy.workspace, self._host_folder, boundary,
                                        str(content.get("ename", "")), str(content.get("evalue", "")))
            if hint:
                self.send_stderr(parent, hint)

    def on_input_request(self, frame: AgentFrame, pending: Pending) -> None:
        # On the kernel's own loop, never a helper thread: ZMQ sockets are not thread-safe,
        # and polling the stdin socket from a thread while ipykernel closed it at shutdown
        # aborted the proxy with "Assertion failed: pfd.revents & POLLIN (signaler.cpp)".
        content = frame.content
        task = asyncio.ensure_future(self._ask_frontend(
            pending, str(content.get("prompt", "")), bool(content.get("password", False))))
        pending.on_done.append(task.cancel)

        def answered(t: asyncio.Task) -> None:
            if not t.cancelled() and t.exception() is None and t.result() is not None:
                background(self._send_input_reply(frame, t.result()))

        task.add_done_callback(answered)

    async def _send_input_reply(self, frame: AgentFrame, value: str) -> None:
        try:
            await self._relay.send_stdin_reply(frame, value)
        except SandboxKernelError as err:
            log.warning("input_reply not delivered: %s", err)

    async def _ask_frontend(self, p: Pending, prompt: str, password: bool) -> str | None:
        """Send ``input_request`` on the stdin channel and wait for ``input_reply``
        (spec, "Messages on the stdin channel"); None if the socket closed.  Cancelled
        when the cell ends first."""
        sock = self.stdin_socket
        try:
            while True:  # drop stale replies
                sock.recv_multipart(zmq.NOBLOCK)
        except zmq.ZMQError:
            pass
        try:
            self._session.send(sock, "input_request", {"prompt": prompt, "password": password},
                              p.parent, ident=p.ident)
            while True:
                _, reply = self._session.recv(sock, zmq.NOBLOCK)
                if reply is not None:
                    try:
                        return str(reply["content"]["value"])
                    except (KeyError, TypeError):
                        return ""
                await asyncio.sleep(0.02)
        except zmq.ZMQError:
            return None

    def on_lifecycle(self, event: LifecycleEvent, detail: str) -> None:
        log.info("sandbox %s: %s", event.value, detail)
        if event is LifecycleEvent.STARTED and self.workspace_copy is not None:
            self.workspace_copy.mark_fresh()
        if event in (LifecycleEvent.RESUMED, LifecycleEvent.RESTORED, LifecycleEvent.REWOUND, LifecycleEvent.FORKED):
            self.cells.note(detail)  # shown on the next cell (the one that woke it)
        if event in (LifecycleEvent.REWOUND, LifecycleEvent.FORKED):  # subshells made again in the copy
            self.subshells.map.new_interpreter()
        if event is LifecycleEvent.FORKED:  # its source's interpreter, given the setup already
            self.interpreter_setup.needed = False
        if event in (LifecycleEvent.STARTED, LifecycleEvent.RESTARTED):  # a fresh interpreter
            self.interpreter_setup.fresh_interpreter()
            self.subshells.map.new_interpreter()
        fresh = event is LifecycleEvent.RESTARTED or (event is LifecycleEvent.STARTED and self._started_once)
        if fresh:  # a fresh interpreter announces itself, as a restarted stock kernel does
            self.publish("status", {"execution_state": "starting"}, {})
        self._started_once = self._started_once or event in (LifecycleEvent.STARTED, LifecycleEvent.FORKED)

    # ---- requests answered here ------------------------------------------------------

    @property
    def kernel_info(self) -> dict[str, Any]:
        info = super().kernel_info
        inner = self.relay.kernel_info if self.relay else None
        if inner:
            for k in ("language_info", "banner", "help_links"):
                if k in inner:
                    info[k] = inner[k]
        info["supported_features"] = self.inner_features()  # never subshells through the relay
        info["sandbox"] = self.relay.describe() if self.relay else {"state": "stopped"}
        info["sandbox"]["workspace"] = workspace.Workspace.of(self.policy).describe()
        info["sandbox"]["ipython_config"] = self.interpreter_setup.setup.describe()
        if self.lifecycle is not None:
            info["sandbox"]["idle"] = self.lifecycle.describe()
        if self._start_error:
            info["sandbox"]["error"] = self._start_error
            # what a console prints first: the kernel answers, its sandbox does not
            then = ("Correct the kernel's options, then restart it." if self.config_error
                    else "Each cell asks for one again.")
            info["banner"] = (f"sandbox-kernel: no sandbox: {self._start_error}\n{then}\n\n"
                              + str(info.get("banner", "")))
        return info

    async def kernel_info_request(self, stream, ident, parent) -> None:
        """On shell, wait (up to :attr:`start_wait_s`) for the first sandbox so the reply
        carries the inner interpreter's ``language_info``; on control, answer at once
        (Jupyter Server asks there while the kernel starts, and shows "Unknown" until
        answered)."""
        if (stream is not self.control_stream and self.relay is not None
                and self.relay.kernel_info is None and self._start_task is not None):
            await self.on_main_loop(self._wait_first_start(self.start_wait_s))
        await super().kernel_info_request(stream, ident, parent)

    async def _wait_first_start(self, timeout_s: float) -> None:
        if self._start_task is not None:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(asyncio.shield(self._start_task), timeout_s)

    async def interrupt_request(self, stream, ident, parent) -> None:
        """Handle ``interrupt_request`` on the control thread: SIGINT inside the sandbox."""
        content: dict[str, Any] = {"status": "ok"}
        if self.relay is not None:
            try:
                await asyncio.wait_for(self.on_main_loop(self._relay.interrupt()), self.interrupt_timeout_s)
            except (TimeoutError, SandboxKernelError) as err:
                content = {"status": "error", "ename": type(err).__name__, "evalue": str(err),
                           "traceback": []}
        self.send_reply(stream, "interrupt_reply", content, parent, ident)

    async def do_shutdown(self, restart: bool) -> dict[str, Any]:
        """Remove the sandbox (a restart, too: the frontend starts a new kernel process).

        From its first line no request starts or wakes a sandbox (requests queued
        behind it, e.g. cells sent with ``stop_on_error=False``, are answered with
        ``KernelShuttingDown``); a read-write workspace is copied back, then
        :meth:`Relay.shutdown` waits for what was under way and removes the sandbox.
        """
        self._shutting_down = True
        if self.relay is not None:  # the running cell is answered now, not after the kill
            await self.on_main_loop(self._fail_pending_now())
        # ...and the cells queued behind it (ipykernel stops its loop after shutdown_reply:
        # a request still waiting for its subshell's lock would never be answered)
        on_shell = threading.current_thread() is not self.control_thread
        if not await self._shell_in_hand.drained(SHELL_DRAIN_S, leave=int(on_shell)):
            log.warning("%d shell request(s) still in hand at shutdown", len(self._shell_in_hand))
        if self.workspace_copy is not None:  # rw: what the sandbox changed comes back
            await self.on_main_loop(self.workspace_copy.at_shutdown(self.shutdown_timeout_s))
        if self.relay is not None:
            try:
                await asyncio.wait_for(self.on_main_loop(self.relay.shutdown()), self.shutdown_timeout_s)
            except Exception:
                log.exception("sandbox shutdown failed")
        self.snapshots.remove_all()  # removed with the kernel
        return {"status": "ok", "restart": restart}

    async def _fail_pending_now(self) -> None:
        self._relay.fail_pending("the kernel is shutting down")

    async def shell_main(self, subshell_id: str | None, msg: Any) -> None:
        """ipykernel's handler of one shell message, counted (:meth:`do_shutdown` waits for
        every message already received to be answered before ``shutdown_reply``)."""
        with self._shell_in_hand:
            await super().shell_main(subshell_id, msg)

    async def _progressively_terminate_all_children(self) -> None:
        """ipykernel's ladder (SIGTERM, then SIGKILL, sleeping up to 14 s each) is for
        processes cell code started in the kernel's own process; here none runs, and
        :meth:`do_shutdown` has already ended the sandbox.  A child still in this process
        group (a completion-cache build started for this interpreter, which is rebuilt
        when next needed) is killed at once, so the exit stays within the frontend's
        grace period (jupyter_client sends SIGTERM 2.5 s after ``shutdown_request``)."""
        for child in self._process_children():
            with contextlib.suppress(Exception):  # psutil: it may be gone already
                log.info("ending child process %s at shutdown: %s", child.pid, " ".join(child.cmdline()[:4]))
                child.kill()
