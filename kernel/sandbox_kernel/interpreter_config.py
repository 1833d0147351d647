"""IPython configuration meant for the interpreter, carried into the sandbox (issue 18, item 9).

A stock ipykernel reads its options from the command line (``--InlineBackend.*``,
``--HistoryManager.*``, ``--IPKernelApp.exec_lines``..., which nbclient and
papermill pass) and from the user's IPython profile (``ipython_config.py``,
``ipython_kernel_config.py``, ``startup/*.py``).  The proxy's application loads
the same on the host (it is an ``IPKernelApp``), but it has no IPython shell:
without this module those options would stop at the proxy and the interpreter
inside would behave differently from a stock kernel given them.

What is carried (:class:`InterpreterSetup`): the configuration sections of the
interpreter's own classes (:data:`FORWARDED_SECTIONS`; of ``IPKernelApp`` only
:data:`FORWARDED_APP_TRAITS`, never connection, port or file options), values
that are plain literals only; and the text of the profile's startup files.
They are applied inside the sandbox after each fresh interpreter starts, by one
silent ``execute_request`` the frontend never sees, the way ``%config`` applies
configuration to a running shell, then startup files, then ``exec_lines``.
Nothing is mounted: the host's home and profile directory stay outside, and
startup files run inside the sandbox like any cell.  :class:`SetupRunner` sends
that request (it reaches the kernel through
:class:`~sandbox_kernel.kernel_face.KernelFace`).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import stat
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .sandbox_state import notice

if TYPE_CHECKING:
    from .inflight import Pending
    from .kernel_face import KernelFace
    from .protocol import AgentFrame

log = logging.getLogger("sandbox_kernel")

#: Configuration sections of classes that live in the interpreter (IPython's shell,
#: formatters, completer, history, magics; ipykernel's kernel and inline backend).
FORWARDED_SECTIONS = frozenset({
    "InteractiveShell", "ZMQInteractiveShell", "InlineBackend", "HistoryManager", "HistoryAccessor",
    "PlainTextFormatter", "DisplayFormatter", "IPCompleter", "Completer", "IPythonKernel",
    "StoreMagics", "ScriptMagics", "MagicsManager", "PrefilterManager", "AliasManager",
})
#: ``IPKernelApp`` options about the interpreter's start (not its sockets or files).
FORWARDED_APP_TRAITS = frozenset({"exec_lines", "code_to_run", "extensions", "extra_extensions",
                                  "matplotlib", "pylab", "gui", "hide_initial_ns"})
#: The profile's configuration files a stock ipykernel loads, in its order.
PROFILE_CONFIG_FILES = ("ipython_config.py", "ipython_kernel_config.py")
#: Largest total of profile file text (configuration and startup files) carried in.
MAX_STARTUP_BYTES = 1 << 20
#: ``msg_id`` prefix of the silent setup request: its IOPub never reaches the frontend.
SETUP_MSG_PREFIX = "sandbox-kernel-setup-"

#: The code run inside the sandbox; ``__sk_payload`` is a JSON string literal.  It
#: leaves no name behind in the user's namespace.
_SETUP_CODE = '''\
def __sk_setup(payload):
    import json, sys, traceback
    from traitlets.config import Config
    from traitlets.config.loader import DeferredConfigList, DeferredConfigString

    def revive(v):  # command-line values of classes the proxy does not have: parsed by the trait
        if isinstance(v, dict) and set(v) == {"__deferred_str__"}:
            return DeferredConfigString(v["__deferred_str__"])
        if isinstance(v, dict) and set(v) == {"__deferred_list__"}:
            return DeferredConfigList(v["__deferred_list__"])
        return v

    p = json.loads(payload)
    ip = get_ipython()
    before = set(ip.user_ns)
    cfg = Config()
    for name, text in p["config_files"]:  # the profile's files, then the command line over them
        file_cfg = Config()
        try:
            exec(compile(text, name, "exec"), {"c": file_cfg, "get_config": lambda: file_cfg,
                                                "load_subconfig": lambda *a, **k: None})
        except Exception:
            print(f"sandbox-kernel: {name} from your IPython profile raised:", file=sys.stderr)
            traceback.print_exc()
            continue
        cfg.merge(file_cfg)
    cfg.merge(Config({sec: {k: revive(v) for k, v in traits.items()} for sec, traits in p["config"].items()}))
    if cfg:
        from traitlets.config import Configurable
        ip.config.merge(cfg)
        targets = [ip, getattr(ip, "kernel", None), *(getattr(ip, n, None) for n in ip.trait_names()),
                   *ip.display_formatter.formatters.values()]
        try:
            from matplotlib_inline.config import InlineBackend
            targets.append(InlineBackend.instance())
        except Exception:
            pass
        seen = set()
        for obj in targets:  # as %config does for a running shell, on every configurable of it
            if isinstance(obj, Configurable) and id(obj) not in seen:
                seen.add(id(obj))
                obj.update_config(cfg)
        ip.InteractiveTB.set_mode(mode=ip.xmode)  # read only at the shell's start otherwise
    app = p["app"]
    for ext in list(app.get("extensions") or []) + list(app.get("extra_extensions") or []):
        try:
            ip.extension_manager.load_extension(ext)
        except Exception:
            print(f"sandbox-kernel: extension {ext!r} from your IPython configuration failed:",
                  file=sys.stderr)
            traceback.print_exc()
    gui = app.get("matplotlib") or app.get("pylab")
    if gui:
        ip.run_line_magic("matplotlib", "" if gui == "auto" else gui)
    for name, text in p["startup"]:
        try:
            if name.endswith(".ipy"):
                ip.run_cell(text, store_history=False)
            else:
                exec(compile(text, name, "exec"), ip.user_ns)
        except Exception:
            print(f"sandbox-kernel: startup file {name} raised:", file=sys.stderr)
            traceback.print_exc()
    for line in list(app.get("exec_lines") or []) + ([app["code_to_run"]] if app.get("code_to_run") else []):
        ip.run_cell(line, store_history=False)
    if app.get("hide_initial_ns", True):
        ip.user_ns_hidden.update({k: v for k, v in ip.user_ns.items() if k not in before})
__sk_setup(__sk_payload)
del __sk_setup, __sk_payload
'''


def _encode(value: Any) -> Any:
    """A configuration value as JSON: traitlets' deferred command-line strings and lists
    (values for classes the proxy does not have, parsed later by the trait that takes
    them) tagged so the sandbox side revives them as such."""
    from traitlets.config.loader import DeferredConfigList, DeferredConfigString

    if isinstance(value, DeferredConfigString):
        return {"__deferred_str__": str(value)}
    if isinstance(value, DeferredConfigList):
        return {"__deferred_list__": [str(v) for v in value]}
    return value


def _literal(value: Any) -> bool:
    """True for values a JSON round trip keeps (str, numbers, bools, None, lists, dicts)."""
    if value is None or isinstance(value, (str, bool, int, float)):
        return True
    if isinstance(value, (list, tuple)):
        return all(_literal(v) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and _literal(v) for k, v in value.items())
    return False


@dataclass
class InterpreterSetup:
    """What a fresh interpreter in the sandbox is given of the host's IPython configuration.

    Attributes
    ----------
    config : dict
        ``{section: {trait: value}}`` of :data:`FORWARDED_SECTIONS`, plain literals only.
    app : dict
        ``IPKernelApp`` traits of :data:`FORWARDED_APP_TRAITS`.
    startup : list of (str, str)
        ``(file name, text)`` of the profile's ``startup/*.py`` and ``*.ipy``, in
        name order (as IPython runs them).
    config_files : list of (str, str)
        ``(file name, text)`` of the profile's :data:`PROFILE_CONFIG_FILES`, run
        inside the sandbox (the proxy, named ``sandbox-kernel``, does not load
        ``ipython_kernel_config.py``); the command line's values win over them.
        Startup and config files together are at most :data:`MAX_STARTUP_BYTES`.
    skipped : list of str
        What was left out and why, for the log.
    """

    config: dict[str, dict[str, Any]] = field(default_factory=dict)
    app: dict[str, Any] = field(default_factory=dict)
    startup: list[tuple[str, str]] = field(default_factory=list)
    config_files: list[tuple[str, str]] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)

    @classmethod
    def collect(cls, config: Any, profile_dir: str | None) -> InterpreterSetup:
        """Collect from the proxy application's loaded configuration and profile.

        Parameters
        ----------
        config : traitlets.config.Config
            The proxy kernel's ``config`` (command line and profile config files,
            as ``IPKernelApp`` loaded them).
        profile_dir : str or None
            The IPython profile directory on the host (``ProfileDir.location``);
            None or missing: no profile files.  Files are read without following
            links; nothing in it is run on the host.
        """
        setup = cls()
        for section in sorted(FORWARDED_SECTIONS | {"IPKernelApp"}):
            values = config.get(section) if hasattr(config, "get") else None
            if not values:
                continue
            for trait, value in dict(values).items():
                if section == "IPKernelApp" and trait not in FORWARDED_APP_TRAITS:
                    continue
                if not _literal(value):
                    setup.skipped.append(f"{section}.{trait} (not a plain value)")
                    continue
                if section == "IPKernelApp":
                    setup.app[trait] = value
                else:
                    setup.config.setdefault(section, {})[trait] = _encode(value)
        budget = [MAX_STARTUP_BYTES]
        if profile_dir and os.path.isdir(profile_dir):
            for name in PROFILE_CONFIG_FILES:
                setup._read(os.path.join(profile_dir, name), setup.config_files, budget)
            startup_dir = os.path.join(profile_dir, "startup")
            if os.path.isdir(startup_dir):
                for name in sorted(os.listdir(startup_dir)):
                    if name.endswith((".py", ".ipy")):
                        setup._read(os.path.join(startup_dir, name), setup.startup, budget)
        return setup

    def _read(self, path: str, into: list[tuple[str, str]], budget: list[int]) -> None:
        """Append ``(name, text)`` of the regular file ``path``, within ``budget[0]`` bytes."""
        name = os.path.basename(path)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError:
            return  # absent (or a link: not followed)
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                return
            with os.fdopen(fd, "rb", closefd=False) as f:
                data = f.read(budget[0] + 1)
            text = data.decode("utf-8")
        except (OSError, UnicodeDecodeError) as err:
            self.skipped.append(f"{name} ({err})")
            return
        finally:
            os.close(fd)
        if len(data) > budget[0]:
            self.skipped.append(f"{name} (over {MAX_STARTUP_BYTES} bytes of profile files in all)")
            return
        budget[0] -= len(data)
        into.append((name, text))

    @property
    def empty(self) -> bool:
        """Nothing to apply: no silent request is sent."""
        return not (self.config or self.app or self.startup or self.config_files)

    def code(self) -> str:
        """The source of the silent cell that applies this setup inside the sandbox.

        >>> s = InterpreterSetup(config={"InlineBackend": {"figure_formats": ["svg"]}})
        >>> "figure_formats" in s.code() and s.code().startswith("__sk_payload = ")
        True
        """
        payload = json.dumps({"config": self.config, "app": self.app, "startup": self.startup,
                              "config_files": self.config_files})
        return f"__sk_payload = {payload!r}\n{_SETUP_CODE}"

    def describe(self) -> dict[str, Any]:
        """For ``kernel_info["sandbox"]["ipython_config"]`` and the log: names only, no values."""
        return {"sections": sorted(self.config), "app": sorted(self.app),
                "config_files": [n for n, _ in self.config_files], "startup_files": [n for n, _ in self.startup]}

    def log_skipped(self, log: logging.Logger) -> None:
        for s in self.skipped:
            log.warning("IPython configuration not carried into the sandbox: %s", s)


class SetupRunner:
    """Applies an :class:`InterpreterSetup` in each fresh interpreter, once, before the
    first request reaches it.

    Parameters
    ----------
    kernel : KernelFace
        The proxy kernel: makes the request, owns the relay it goes through.
    setup : InterpreterSetup

    Attributes
    ----------
    needed : bool
        The current interpreter has not been given the setup yet (never, when it is empty).
    """

    def __init__(self, kernel: KernelFace, setup: InterpreterSetup):
        self.kernel = kernel
        self.setup = setup
        self.needed = not setup.empty
        self._lock = asyncio.Lock()

    def fresh_interpreter(self) -> None:
        """A fresh interpreter started (a sandbox started, an interpreter restarted)."""
        self.needed = not self.setup.empty

    async def apply(self) -> str | None:
        """Run the silent setup request in the sandbox's interpreter if it still needs it;
        its outputs go to the log (:meth:`takes`).  Run on the main loop, the sandbox running.

        Returns
        -------
        str or None
            A notice for the next cell if the setup failed there (also logged).
        """
        async with self._lock:
            if not self.needed:
                return None
            self.needed = False
            relay = self.kernel.relay
            assert relay is not None, "applied once the sandbox runs"
            parent = self.kernel.new_message("execute_request", {
                "code": self.setup.code(), "silent": True, "store_history": False,
                "user_expressions": {}, "allow_stdin": False, "stop_on_error": False})
            parent["header"]["msg_id"] = SETUP_MSG_PREFIX + parent["header"]["msg_id"]
            p = await relay.send_request("shell", parent, [])
            reply = await relay.wait(p)
            content = reply.content if reply is not None else {}
            if content.get("status") != "ok":
                why = f"{content.get('ename', 'no reply')}: {content.get('evalue', '')}"
                log.warning("applying the IPython configuration in the sandbox failed: %s", why)
                return notice(f"your IPython configuration could not be applied in "
                              f"the sandbox ({why}); see the kernel's log.")
        return None

    @staticmethod
    def takes(frame: AgentFrame, pending: Pending | None) -> bool:
        """True for an IOPub message of the setup request: never shown in a cell (its
        ``stream`` and ``error`` output goes to the log)."""
        if pending is None or not pending.msg_id.startswith(SETUP_MSG_PREFIX):
            return False
        if frame.msg_type in ("stream", "error"):  # the setup's own output: the log, not a cell
            text = frame.content.get("text") or "\n".join(map(str, frame.content.get("traceback") or []))
            log.info("IPython configuration in the sandbox: %s", str(text)[:4000])
        return True
