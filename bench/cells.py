"""The timer every request is timed with, and the cell that runs it inside a kernel."""

from __future__ import annotations

#: Source of the request/response timer.  It is exec'd here and also sent as cell
#: code for the "runtime" figure, so the nested measurement inside a sandbox uses the
#: very same method as the outer one.  ``zmq.Poller`` over shell and IOPub: no
#: polling intervals, the loop wakes on the message itself.
TIMER_SRC = r'''
import time as _time
import zmq as _zmq

class Timer:
    """Time requests on a started BlockingKernelClient, waiting on both sockets at once."""

    def __init__(self, kc):
        self.kc = kc
        self.shell, self.iopub = kc.shell_channel, kc.iopub_channel
        self.poller = _zmq.Poller()
        self.poller.register(self.shell.socket, _zmq.POLLIN)
        self.poller.register(self.iopub.socket, _zmq.POLLIN)

    @staticmethod
    def _drain(ch):
        out = []
        while True:
            try:
                out.append(ch._recv(flags=_zmq.NOBLOCK))
            except _zmq.Again:
                return out

    def request(self, send, wait_idle=True, on_iopub=None, timeout=120.0):
        """Call ``send()`` (returns a msg_id); wait for its reply (and idle). Return (seconds, reply)."""
        t0 = _time.perf_counter()
        msg_id = send()
        reply, idle = None, not wait_idle
        deadline = t0 + timeout
        while reply is None or not idle:
            left = deadline - _time.perf_counter()
            if left <= 0:
                raise TimeoutError("no reply in %.0f s" % timeout)
            events = dict(self.poller.poll(int(left * 1000) + 1))
            if self.shell.socket in events:
                for m in self._drain(self.shell):
                    if m["parent_header"].get("msg_id") == msg_id:
                        reply = m
            if self.iopub.socket in events:
                for m in self._drain(self.iopub):
                    if m["parent_header"].get("msg_id") != msg_id:
                        continue
                    if m["msg_type"] == "status":
                        if m["content"]["execution_state"] == "idle":
                            idle = True
                    elif on_iopub is not None:
                        on_iopub(m)
        return _time.perf_counter() - t0, reply

    def execute(self, code, **kw):
        return self.request(lambda: self.kc.execute(code, store_history=False), **kw)
'''
exec(compile(TIMER_SRC, "<bench timer>", "exec"), globals())
Timer: type = globals()["Timer"]  # defined by TIMER_SRC just above; named here for readers and linters

#: Cell run on every target for the "runtime_rtt" figure: start a *stock* ipykernel next
#: to the kernel under test (inside the sandbox for proxy targets), and time trivial
#: cells against it with the same Timer, client in the same place.  @N@, @WARM@ are filled in.
NESTED_CELL = TIMER_SRC + r'''
import json as _json, subprocess as _sp
from jupyter_client.manager import start_new_kernel as _snk
_km, _kc = _snk(kernel_name="python3", stdout=_sp.DEVNULL, stderr=_sp.DEVNULL, startup_timeout=120)
try:
    _t = Timer(_kc)
    _s = []
    for _i in range(@WARM@ + @N@):
        _dt, _r = _t.execute("pass")
        if _i >= @WARM@:
            _s.append(_dt)
    print("NESTED" + _json.dumps(_s))
finally:
    _kc.stop_channels()
    _km.shutdown_kernel(now=True)
'''
