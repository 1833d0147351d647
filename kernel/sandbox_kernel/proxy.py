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
import collections
import contextlib
import logging
import os
import platform
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any

import zmq
from ipykernel.kernelbase import Kernel
from jupyter_client.session import Session

from . import __version__, workspace
from .aio import InHand, background
from .backends.base import SandboxBackend, Usage
from .dispatch import OwnParentDispatch
from .errors import AdmissionRefused, KernelShuttingDown, NoReply, SandboxDied, SandboxKernelError
from .files import FileTransfers
from .files_comm import FilesComm
from .interpreter_config import SETUP_MSG_PREFIX, InterpreterSetup
from .lifecycle import IdleLifecycle
from .options import KernelOptions
from .outputs.budget import COUNTED_IOPUB, OutputBudget
from .policy import Policy
from .protocol import AgentFrame
from .relay import SHUTTING_DOWN, Pending, Relay
from .sandbox_state import PROGRESS_METADATA, LifecycleEvent, notice
from .subshells import SubshellMap
from .usage import UsageReporter, cell_usage
from .workspace_copy import WorkspaceCopy

log = logging.getLogger("sandbox_kernel")

#: Shell requests relayed with a reply expected (messaging spec, "Messages on the shell channel").
RELAYED_REQUESTS = (
    "execute_request",
    "complete_request",
    "inspect_request",
    "history_request",
    "is_complete_request",
    "comm_info_request",
)
#: Comm messages: relayed both ways, no reply (spec, "Custom Messages").
RELAYED_COMMS = ("comm_open", "comm_msg", "comm_close")
#: Seconds a shutdown waits for the shell requests already received to be answered
#: (jupyter_client sends SIGTERM 2.5 s after ``shutdown_request``).
SHELL_DRAIN_S = 1.0
#: Features of the inner kernel's ``supported_features`` (spec, "Kernel info") the relay
#: carries: the debugger's ``debug_request``/``debug_reply``/``debug_event`` (spec,
#: "Debug request" and "Debug event") go through to the sandbox's own ipykernel; kernel
#: subshells (JEP 91) are made in both the proxy and the sandbox (:mod:`.subshells`).
RELAYED_FEATURES = ("kernel subshells", "debugger")
#: IOPub types never relayed: status is the proxy's own, the rest are the inner kernel's business.
DROPPED_IOPUB = frozenset({"status", "shutdown_reply"})

#: Seconds a cell waits for its sandbox (start, wake, restore) before the wait is shown in it.
PROGRESS_AFTER_S = 0.5
#: Seconds between updates of that line.
PROGRESS_EVERY_S = 1.0


_ANSI_RED = "\x1b[0;31m"
_ANSI_RESET = "\x1b[0m"


@dataclass
class CellState:
    """The proxy's own bookkeeping of one running ``execute_request``."""

    budget: OutputBudget
    #: The cell ran past ``cell_timeout_s`` and was interrupted.
    timed_out: bool = False
    #: The sandbox's use when the cell was relayed (:func:`.usage.cell_usage`), and when.
    usage_before: Usage | None = None
    started: float = 0.0


class SandboxKernel(KernelOptions, OwnParentDispatch, Kernel):
    """Jupyter kernel whose interpreter runs in a sandbox.

    Configure with traitlets, e.g. kernelspec argv
    ``--SandboxKernel.backend=local --SandboxKernel.memory_mib=2048
    --LocalBackend.runtime=gvisor``; the options are :class:`~.options.KernelOptions`'
    (the policy's and the kernel's own) and the backend class's.  Each request's
    ``status`` keeps its own parent however requests overlap (:mod:`.dispatch`).
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
        self.control_handlers["debug_request"] = self._debug_request
        self.control_handlers["create_subshell_request"] = self._create_subshell
        self.control_handlers["delete_subshell_request"] = self._delete_subshell
        self.control_handlers["list_subshell_request"] = self._list_subshells
        self.subshells = SubshellMap()
        self.control_handlers["interrupt_request"] = self.interrupt_request
        self.control_handlers["usage_request"] = self._usage_request  # the sandbox's, not the host's
        self._usage = UsageReporter()
        self.kernel_id = uuid.uuid4().hex
        self.sandbox: SandboxBackend | None = None
        #: Why the configuration cannot work (a bad option): every request is answered
        #: with it, instead of the kernel process dying where no user sees why.
        self._config_error: str | None = None
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
            self._config_error = f"{err}. Fix the kernelspec or the configuration, then restart the kernel"
            log.error("configuration error: %s", err)
        #: The last execute_request relayed: egress attempts are attributed to its cell.
        self._last_execute: dict | None = None
        if self.sandbox is not None:
            self._warn_unenforced(self.sandbox)
            self.sandbox.egress_log.observe(
                lambda: self._last_execute["header"]["msg_id"] if self._last_execute else None,
                self._show_egress_denial)
        from .outputs import OutputFirewall

        self.firewall = OutputFirewall(self.policy.output_policy, self.policy.trusted_widget_modules,
                                       self.policy.trusted_comm_targets)
        self.relay: Relay | None = None
        #: The copied workspace of a backend that cannot mount it (made by start_sandbox).
        self.workspace_copy: WorkspaceCopy | None = None
        self.lifecycle: IdleLifecycle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._start_task: asyncio.Task | None = None
        self._start_error: str | None = self._config_error
        self._notices: list[str] = []
        #: msg_id -> what the proxy tracks of a running cell (output budget, timeout).
        self._cells: dict[str, CellState] = {}
        self._started_once = False
        #: The host's IPython configuration for the interpreter (issue 18 item 9), applied
        #: once per fresh interpreter before the first request reaches it.
        self.interpreter_setup = self._collect_interpreter_setup()
        self._setup_needed = not self.interpreter_setup.empty
        self._setup_lock = asyncio.Lock()
        #: Set first thing by :meth:`do_shutdown`: requests still queued are refused.
        self._shutting_down = False
        self._shell_in_hand = InHand()
        #: msg_id -> frontend request of recent requests, for IOPub that outlives its request.
        self._recent_parents: collections.OrderedDict[str, dict] = collections.OrderedDict()

    def _collect_interpreter_setup(self) -> InterpreterSetup:
        if not self.forward_ipython_config:
            return InterpreterSetup()
        profile_dir = getattr(self.parent, "profile_dir", None)
        setup = InterpreterSetup.collect(self.config, getattr(profile_dir, "location", None))
        setup.log_skipped(log)
        if not setup.empty:
            log.info("IPython configuration carried into the sandbox: %s", setup.describe())
        return setup

    async def _apply_interpreter_setup(self) -> None:
        """Run the silent setup request (:mod:`.interpreter_config`) in a fresh interpreter;
        its outputs go to the log, and an error in it to the next cell's notices."""
        async with self._setup_lock:
            if not self._setup_needed:
                return
            self._setup_needed = False
            parent = self._session.msg("execute_request", {
                "code": self.interpreter_setup.code(), "silent": True, "store_history": False,
                "user_expressions": {}, "allow_stdin": False, "stop_on_error": False})
            parent["header"]["msg_id"] = SETUP_MSG_PREFIX + parent["header"]["msg_id"]
            p = await self._relay.send_request("shell", parent, [])
            reply = await self._relay.wait(p)
            content = reply.content if reply is not None else {}
            if content.get("status") != "ok":
                why = f"{content.get('ename', 'no reply')}: {content.get('evalue', '')}"
                log.warning("applying the IPython configuration in the sandbox failed: %s", why)
                self._notices.append(notice(f"your IPython configuration could not be applied in "
                                            f"the sandbox ({why}); see the kernel's log."))

    def _warn_unenforced(self, sandbox: SandboxBackend) -> None:
        """Say, once at start, which policy fields this backend leaves to its own defaults:
        a warning for values the operator set, an info line for defaults nobody chose."""
        fields = sandbox.check_policy(self.policy)
        defaults = Policy()
        chosen = [f for f in fields if getattr(self.policy, f) != getattr(defaults, f)]
        for level, names in ((logging.WARNING, chosen), (logging.INFO, [f for f in fields if f not in chosen])):
            if names:
                log.log(level, "the %s backend does not enforce %s; the sandbox's own limits apply "
                        "(sandbox-kernel doctor lists what each backend enforces)", sandbox.name,
                        ", ".join(f"{f}={getattr(self.policy, f)!r}" for f in names))

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
        if self.sandbox is None:  # a bad configuration: every request says so (_ready)
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
        except KernelShuttingDown:
            log.info("the kernel was shut down before its first sandbox was up")
        except SandboxKernelError as err:
            self._start_error = str(err)
            log.error("sandbox start failed: %s", err)

    async def _ready(self) -> str | None:
        """Wait for the sandbox; return a notice for the user, if any.

        Raises
        ------
        SandboxKernelError
            If no sandbox can be started, or the configuration is bad.
        """
        if self._config_error is not None:
            raise SandboxKernelError(self._config_error)
        if self._shutting_down:
            raise KernelShuttingDown(SHUTTING_DOWN)
        if self._start_task is not None and not self._start_task.done():
            await asyncio.shield(self._start_task)
        notice = await self._relay.ensure_running()
        if self.workspace_copy is not None:  # E2B, Modal: a copy of the workspace, once per sandbox
            await self.workspace_copy.ensure()
        if self._setup_needed:
            await self._apply_interpreter_setup()
        self._start_error = None
        return notice

    async def _ready_with_progress(self, parent: dict) -> str | None:
        """:meth:`_ready`, showing in the waiting cell what it waits for while it waits.

        A wait longer than :data:`PROGRESS_AFTER_S` (a cold start, a restore, memory to
        restore into) shows a ``display_data`` line, ``sandbox-kernel: restoring the
        sandbox from its checkpoint… 3 s``, updated in place every :data:`PROGRESS_EVERY_S`
        (``update_display_data``, spec "Update Display Data") and cleared
        (``clear_output``) before the cell's own outputs and notices: JupyterLab shows
        it where the cell's output will appear, and nothing of it stays in the notebook.
        """
        task = asyncio.ensure_future(self._ready())
        display_id = None
        t0 = time.monotonic()
        try:
            await asyncio.wait({task}, timeout=PROGRESS_AFTER_S)
            while not task.done():
                text = notice(f"{self._relay.progress()}… {time.monotonic() - t0:.0f} s")
                msg_type = "update_display_data" if display_id else "display_data"
                display_id = display_id or uuid.uuid4().hex
                self._session.send(self.iopub_socket, msg_type,
                                   {"data": {"text/plain": text}, "metadata": {PROGRESS_METADATA: True},
                                    "transient": {"display_id": display_id}},
                                   parent, ident=self._topic("display_data"))
                await asyncio.wait({task}, timeout=PROGRESS_EVERY_S)
            return task.result()
        finally:
            if not task.done():  # the request itself was cancelled
                task.cancel()
            if display_id is not None:
                self._session.send(self.iopub_socket, "clear_output", {"wait": False}, parent,
                                   ident=self._topic("clear_output"))

    # ---- relaying -------------------------------------------------------------------

    async def _on_main_loop(self, coro: Any) -> Any:
        """Await ``coro`` on the proxy's main loop from whichever loop calls.

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
        reply_type, content, md = await self._on_main_loop(self._relayed_reply(ident, parent, channel))
        self._session.send(stream, reply_type, content, parent, ident, metadata=md)
        if (reply_type == "execute_reply" and content.get("status") == "error"
                and parent["content"].get("stop_on_error", True) and stream is not self.control_stream):
            self._abort_queues(parent["header"].get("subshell_id"))  # that subshell's queue only

    async def _relayed_reply(self, ident, parent, channel: str) -> tuple[str, dict, dict]:
        """Relay ``parent`` to the inner kernel's ``channel``; return ``(reply_type, content,
        metadata)``."""
        msg_type = parent["header"]["msg_type"]
        reply_type = msg_type.replace("_request", "_reply")
        is_execute = msg_type == "execute_request"
        try:
            notice = await (self._ready_with_progress(parent) if is_execute and self.lifecycle_notices
                            else self._ready())
        except SandboxKernelError as err:
            lost = self._relay.state_notice if self.relay is not None else None
            if lost and is_execute:  # state was lost and no sandbox came back: both are said
                self._send_stderr(parent, lost)
            # AdmissionRefused: the resource and the numbers as fields, for agents
            extra = {"admission": err.details} if isinstance(err, AdmissionRefused) else None
            return reply_type, self._error_reply(parent, reply_type, getattr(err, "ename", "SandboxUnavailable"),
                                                 f"{err}", publish=is_execute, extra=extra), {}
        if notice and is_execute:
            self._send_stderr(parent, notice)
        notes, self._notices = self._notices, []
        if is_execute and self.lifecycle_notices:
            for n in notes:
                self._send_stderr(parent, n)
        msg_id = str(parent["header"]["msg_id"])
        if is_execute:  # before the request goes out: its first output may come at once
            self._last_execute = parent
            self._cells[msg_id] = CellState(OutputBudget(self.policy.max_output_bytes_per_cell,
                                                         self.policy.max_output_msgs_per_s),
                                            usage_before=self._sandbox_usage(reset_peak=True),
                                            started=time.monotonic())
        try:
            header = await self._inner_subshell_header(parent) if channel == "shell" else None
            p = await self._relay.send_request(channel, parent, ident, header=header)
            timer = self._arm_timeout(p) if is_execute else None
            try:
                reply = await self._relay.wait(p)
            finally:
                if timer is not None:
                    timer.cancel()
        except SandboxDied as err:
            self._cells.pop(msg_id, None)
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
            self._cells.pop(msg_id, None)
            return reply_type, self._error_reply(parent, reply_type, "NoReplyFromSandbox", str(err),
                                                 publish=is_execute), {}
        assert reply is not None  # requests (not comms) always have one
        content, notes = self.firewall.filter_reply(reply_type, dict(reply.content))
        for n in notes:
            if is_execute:  # a page payload: shown in the cell
                self._send_stderr(parent, n)
            else:  # inspect_reply: no cell to show it in
                log.info("%s", n)
        metadata = reply.metadata
        if is_execute:
            cell = self._cells.get(p.msg_id)
            if cell is not None:  # what the cell cost, against the limits (.usage)
                metadata = {**metadata, "sandbox_usage": cell_usage(
                    self.policy, cell.usage_before, self._sandbox_usage(), time.monotonic() - cell.started)}
            try:
                content = self._finish_execute(p, content)
            except Exception:  # a notice must never cost the user the reply
                log.exception("post-processing the execute_reply failed; relaying it unchanged")
        return reply_type, content, metadata

    def _sandbox_usage(self, reset_peak: bool = False) -> Usage | None:
        try:
            return self.sandbox.usage(reset_peak) if self.sandbox is not None else None
        except Exception:  # a figure must never cost the user a cell
            log.exception("reading the sandbox's usage failed")
            return None

    def _finish_execute(self, p: Pending, content: dict) -> dict:
        cell = self._cells.pop(p.msg_id, None)
        dropped = cell.budget.notice() if cell is not None else None
        if dropped:
            self._send_stderr(p.parent, notice(dropped))
        if content.get("ename") == "MemoryError":
            self._send_stderr(p.parent, notice(f"the sandbox's memory limit is "
                                               f"{self.policy.memory_mib} MiB (memory_mib); the "
                                               "interpreter and its state are intact."))
        if cell is not None and cell.timed_out and content.get("status") == "error":
            content.update(self._timeout_error(content))
        return content

    def _timeout_error(self, content: dict) -> dict:
        """The inner ``KeyboardInterrupt`` of a timed-out cell, renamed so that the reply and
        the error output the notebook shows both name the timeout and how to change it."""
        evalue = (f"cell exceeded cell_timeout_s={self.policy.cell_timeout_s:g} s and was "
                  "interrupted; state is kept. Change it with --SandboxKernel.cell_timeout_s.")
        tb = [*(content.get("traceback") or [])][:-1] if content.get("ename") == "KeyboardInterrupt" else \
            list(content.get("traceback") or [])
        tb.append(f"{_ANSI_RED}CellTimeoutError{_ANSI_RESET}: {evalue}")
        return {"ename": "CellTimeoutError", "evalue": evalue, "traceback": tb}

    def _arm_timeout(self, p: Pending) -> asyncio.TimerHandle | None:
        limit = self.policy.cell_timeout_s
        if not limit:
            return None

        def fire() -> None:
            background(self._on_timeout(p))

        return asyncio.get_running_loop().call_later(limit, fire)

    async def _on_timeout(self, p: Pending) -> None:
        cell = self._cells.get(p.msg_id)
        if p.reply.done() or cell is None:
            return
        cell.timed_out = True
        limit = self.policy.cell_timeout_s
        self._send_stderr(p.parent, notice(f"the cell ran longer than cell_timeout_s={limit:g} s and "
                                           "was interrupted. Change it with --SandboxKernel.cell_timeout_s."))
        await self._relay.interrupt()
        await asyncio.sleep(self.policy.interrupt_grace_s)
        if not p.reply.done():
            reason = (f"the cell ignored the interrupt after cell_timeout_s={limit:g} s "
                      f"(+{self.policy.interrupt_grace_s:g} s grace)")
            self._relay.abandon(p, SandboxDied(reason))
            await self._relay.restart_interpreter(reason)

    async def _relay_comm(self, stream, ident, parent) -> None:
        """Handler of comm messages on shell and control: the file comm is answered here
        (:mod:`.files_comm`), every other comm is relayed to the sandbox."""
        await self._on_main_loop(self._comm(ident, parent))

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
            await self._ready()
            header = await self._inner_subshell_header(parent)  # widget managers use subshells
            p = await self._relay.send_request("shell", parent, ident, expect_reply=False, header=header)
            await self._relay.wait(p)
        except SandboxKernelError as err:
            log.warning("comm message not delivered: %s", err)

    def _error_reply(self, parent, reply_type, ename, evalue, publish, extra: dict | None = None) -> dict:
        """An error reply's content (messaging spec, "Request Reply"); with ``publish``,
        also the IOPub ``error`` a frontend shows in the cell."""
        tb = [f"{_ANSI_RED}{ename}{_ANSI_RESET}: {evalue}"]
        content = {"status": "error", "ename": ename, "evalue": evalue, "traceback": tb, **(extra or {})}
        if publish:
            self._session.send(self.iopub_socket, "error", content, parent,
                              ident=self._topic("error"))
        if reply_type == "execute_reply":
            content = {**content, "execution_count": self._last_count(), "user_expressions": {},
                       "payload": []}
        return content

    # ---- kernel subshells (JEP 91): one in the proxy, one in the sandbox --------------

    async def _create_subshell(self, stream, ident, parent) -> None:
        """``create_subshell_request`` on control: a subshell in the sandbox's ipykernel,
        then the proxy's own (ipykernel's), mapped; the frontend gets the proxy's id."""
        if "kernel subshells" not in self._inner_features():
            await self._unsupported(stream, ident, parent)
            return
        inner_id = await self._on_main_loop(self._create_inner_subshell(parent))
        if inner_id is None:
            content: dict[str, Any] = {"status": "error", "ename": "SubshellError", "traceback": [],
                                       "evalue": "the sandbox's interpreter could not create a subshell"}
        else:
            content = self._proxy_subshell_op({"type": "create"})
            if content.get("status") == "ok":
                self.subshells.add(content["subshell_id"], inner_id)
        self._session.send(stream, "create_subshell_reply", content, parent, ident)

    async def _create_inner_subshell(self, parent: dict) -> str | None:
        """A new subshell in the sandbox's ipykernel (on the main loop); its id, or None."""
        request = self._session.msg("create_subshell_request", {}, parent=parent.get("header") or {})
        _, content, _ = await self._relayed_reply([], request, "control")
        sid = content.get("subshell_id") if content.get("status") == "ok" else None
        return sid if isinstance(sid, str) else None

    async def _delete_subshell(self, stream, ident, parent) -> None:
        if not self._supports_kernel_subshells:
            await self._unsupported(stream, ident, parent)
            return
        proxy_id = str((parent.get("content") or {}).get("subshell_id", ""))
        content = self._proxy_subshell_op({"type": "delete", "subshell_id": proxy_id})
        inner_id = self.subshells.remove(proxy_id)
        if inner_id is not None:
            request = self._session.msg("delete_subshell_request", {"subshell_id": inner_id})
            await self._on_main_loop(self._relayed_reply([], request, "control"))
        self._session.send(stream, "delete_subshell_reply", content, parent, ident)

    async def _list_subshells(self, stream, ident, parent) -> None:
        content = self._proxy_subshell_op({"type": "list"}) if self._supports_kernel_subshells else \
            {"status": "ok", "subshell_id": []}
        self._session.send(stream, "list_subshell_reply", content, parent, ident)

    def _proxy_subshell_op(self, request: dict[str, Any]) -> dict[str, Any]:
        """Create, delete or list the proxy's own subshells (ipykernel's subshell manager,
        through its control-to-shell-channel socket, as ipykernel's own handlers do)."""
        sock = self.shell_channel_thread.manager.control_to_shell_channel.from_socket
        sock.send_json(request)
        return dict(sock.recv_json())

    async def _inner_subshell_header(self, parent: dict) -> dict[str, Any] | None:
        """The inner header fields of a request on a subshell: the sandbox's id for it,
        made anew there when the interpreter restarted since (:class:`.SubshellMap`)."""
        proxy_id = parent["header"].get("subshell_id")
        if not proxy_id:
            return None
        inner_id = self.subshells.inner(proxy_id)
        if inner_id is None and self.subshells.known(proxy_id):
            inner_id = await self._create_inner_subshell(parent)
            if inner_id is not None:
                self.subshells.add(proxy_id, inner_id)
        return {"subshell_id": inner_id}

    async def _usage_request(self, stream, ident, parent) -> None:
        """Handler of ``usage_request`` (jupyter-resource-usage): the sandbox's limits and
        use (:mod:`.usage`); never wakes or starts a sandbox."""
        backend = self.sandbox
        content = self._usage.reply(backend.policy if backend is not None else self.policy, self._sandbox_usage())
        self._session.send(stream, "usage_reply", content, parent, ident)

    async def _debug_request(self, stream, ident, parent) -> None:
        """Handler of ``debug_request`` (a Debug Adapter Protocol request, spec "Debug
        request"): relayed to the inner kernel's control channel when its ipykernel has a
        debugger (debugpy inside the sandbox), else an unsuccessful DAP response."""
        if "debugger" in self._inner_features():
            await self._relay_request(stream, ident, parent)
        else:
            await self._unsupported(stream, ident, parent)

    def _inner_features(self) -> list[str]:
        """The inner kernel's ``supported_features`` this relay carries (:data:`RELAYED_FEATURES`);
        empty until the sandbox's interpreter has answered ``kernel_info``."""
        inner = (self.relay.kernel_info if self.relay else None) or {}
        features = inner.get("supported_features")
        own = {"kernel subshells": self._supports_kernel_subshells}
        return [f for f in RELAYED_FEATURES if isinstance(features, list) and f in features and own.get(f, True)]

    async def _unsupported(self, stream, ident, parent) -> None:
        """Reply to a request for a feature this kernel does not advertise, rather than
        letting ipykernel's base class log an exception and stay silent."""
        msg_type = parent["header"]["msg_type"]
        why = (f"{msg_type} is not supported here: kernel_info_reply's supported_features does not "
               "list it (the sandbox's ipykernel lacks it: the debugger needs debugpy there, subshells "
               "ipykernel 7)")
        if msg_type == "debug_request":  # a Debug Adapter Protocol response
            req = parent.get("content") or {}
            content: dict[str, Any] = {"type": "response", "request_seq": req.get("seq", 0),
                                       "success": False, "command": req.get("command", ""),
                                       "message": why}
        else:
            content = {"status": "error", "ename": "NotSupported", "evalue": why, "traceback": []}
        self._session.send(stream, msg_type.replace("_request", "_reply"), content, parent, ident)

    def _last_count(self) -> int:
        return int(getattr(self, "_exec_count", 0))

    # ---- RelayHost ------------------------------------------------------------------

    def on_iopub(self, frame: AgentFrame, pending: Pending | None) -> None:
        """Publish one IOPub message of the sandbox: with its request's parent, through the
        output firewall and the cell's output budget, re-signed with the frontend's key."""
        msg_type = frame.msg_type
        if msg_type is None or msg_type in DROPPED_IOPUB:
            return
        if pending is not None and pending.msg_id.startswith(SETUP_MSG_PREFIX):
            if msg_type in ("stream", "error"):  # the setup's own output: the log, not a cell
                text = frame.content.get("text") or "\n".join(map(str, frame.content.get("traceback") or []))
                log.info("IPython configuration in the sandbox: %s", str(text)[:4000])
            return
        # Output that arrives after its request finished (a thread started by the
        # cell, a timer) keeps that cell's parent header, as with a stock
        # ipykernel; an empty parent would orphan it in the frontend.
        recent = self._recent_parents
        if pending is not None:
            recent[pending.msg_id] = pending.parent
            recent.move_to_end(pending.msg_id)
            while len(recent) > 256:
                recent.popitem(last=False)
            parent = pending.parent
        else:
            parent = recent.get(frame.parent_msg_id or "", {})
        content = frame.content
        if msg_type in ("execute_input", "execute_result") and isinstance(content.get("execution_count"), int):
            self._exec_count = content["execution_count"]
        if msg_type in ("display_data", "update_display_data", "execute_result"):
            content, notes = self.firewall.filter(msg_type, content)
            for n in notes:
                self._send_stderr(parent, n)
            if msg_type == "display_data" and notes and content.get("data") == {"text/plain": notes[0]}:
                return  # nothing of it left (display(Javascript(...))): the stderr notice says so, once
        buffers = frame.buffers
        if msg_type in RELAYED_COMMS and self.files_comm.claims_from_sandbox(msg_type, content):
            log.warning("dropped a %s from the sandbox posing as the file comm", msg_type)
            return
        if msg_type in RELAYED_COMMS:
            filtered, buffers, notes = self.firewall.filter_comm(msg_type, content, buffers)
            for n in notes:
                self._send_stderr(parent, n)
            if filtered is None:
                return
            content = filtered
        cell = self._cells.get(pending.msg_id) if pending is not None else None
        if msg_type == "error" and cell is not None and cell.timed_out:
            content = {**content, **self._timeout_error(content)}
        if cell is not None and msg_type in COUNTED_IOPUB:
            admitted = cell.budget.admit(msg_type, content, sum(len(b) for b in buffers or ()),
                                         time.monotonic())
            if admitted is None:
                return
            content = admitted
        self._session.send(self.iopub_socket, msg_type, content, parent, ident=self._topic(msg_type),
                           metadata=frame.metadata, buffers=list(buffers) or None)
        if msg_type == "error" and content.get("ename") == "FileNotFoundError" and self.policy.workspace == "none":
            hint = workspace.missing_file_hint(self._host_folder, str(content.get("evalue", "")))
            if hint:
                self._send_stderr(parent, hint)

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
        if event in (LifecycleEvent.RESUMED, LifecycleEvent.RESTORED):  # shown on the cell that woke it
            self._notices.append(detail)
        if event in (LifecycleEvent.STARTED, LifecycleEvent.RESTARTED):  # a fresh interpreter
            self._setup_needed = not self.interpreter_setup.empty
            self.subshells.new_interpreter()
        fresh = event is LifecycleEvent.RESTARTED or (event is LifecycleEvent.STARTED and self._started_once)
        if fresh:  # a fresh interpreter announces itself, as a restarted stock kernel does
            self._session.send(self.iopub_socket, "status", {"execution_state": "starting"}, {},
                              ident=self._topic("status"))
        self._started_once = self._started_once or event is LifecycleEvent.STARTED

    def _show_egress_denial(self, msg_id: str | None, line: str) -> None:
        """A refused egress attempt, on the stderr of the cell it is attributed to."""
        last = self._last_execute
        parent = last if last and last["header"]["msg_id"] == msg_id else self._recent_parents.get(msg_id or "")
        if parent:
            self._send_stderr(parent, line)

    def _send_stderr(self, parent: dict, text: str) -> None:
        # Not ``_stderr``: ipykernel's Kernel.__init__ sets ``self._stderr = sys.stderr``,
        # which shadowed the method and made every notice raise TypeError.
        self._session.send(self.iopub_socket, "stream", {"name": "stderr", "text": text.rstrip("\n") + "\n"},
                          parent, ident=self._topic("stream"))

    # ---- requests answered here ------------------------------------------------------

    @property
    def kernel_info(self) -> dict[str, Any]:
        info = super().kernel_info
        inner = self.relay.kernel_info if self.relay else None
        if inner:
            for k in ("language_info", "banner", "help_links"):
                if k in inner:
                    info[k] = inner[k]
        info["supported_features"] = self._inner_features()  # never subshells through the relay
        info["sandbox"] = self.relay.describe() if self.relay else {"state": "stopped"}
        info["sandbox"]["workspace"] = workspace.Workspace.of(self.policy).describe()
        info["sandbox"]["ipython_config"] = self.interpreter_setup.describe()
        if self.lifecycle is not None:
            info["sandbox"]["idle"] = self.lifecycle.describe()
        if self._start_error:
            info["sandbox"]["error"] = self._start_error
            # what a console prints first: the kernel answers, its sandbox does not
            then = ("Correct the kernel's options, then restart it." if self._config_error
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
            await self._on_main_loop(self._wait_first_start(self.start_wait_s))
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
                await asyncio.wait_for(self._on_main_loop(self._relay.interrupt()), self.interrupt_timeout_s)
            except (TimeoutError, SandboxKernelError) as err:
                content = {"status": "error", "ename": type(err).__name__, "evalue": str(err),
                           "traceback": []}
        self._session.send(stream, "interrupt_reply", content, parent, ident=ident)

    async def do_shutdown(self, restart: bool) -> dict[str, Any]:
        """Remove the sandbox (a restart, too: the frontend starts a new kernel process).

        From its first line no request starts or wakes a sandbox (requests queued
        behind it, e.g. cells sent with ``stop_on_error=False``, are answered with
        ``KernelShuttingDown``); a read-write workspace is copied back, then
        :meth:`Relay.shutdown` waits for what was under way and removes the sandbox.
        """
        self._shutting_down = True
        if self.relay is not None:  # the running cell is answered now, not after the kill
            await self._on_main_loop(self._fail_pending_now())
        # ...and the cells queued behind it (ipykernel stops its loop after shutdown_reply:
        # a request still waiting for its subshell's lock would never be answered)
        on_shell = threading.current_thread() is not self.control_thread
        if not await self._shell_in_hand.drained(SHELL_DRAIN_S, leave=int(on_shell)):
            log.warning("%d shell request(s) still in hand at shutdown", len(self._shell_in_hand))
        if self.workspace_copy is not None:  # rw: what the sandbox changed comes back
            await self._on_main_loop(self.workspace_copy.at_shutdown(self.shutdown_timeout_s))
        if self.relay is not None:
            try:
                await asyncio.wait_for(self._on_main_loop(self.relay.shutdown()), self.shutdown_timeout_s)
            except Exception:
                log.exception("sandbox shutdown failed")
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
