"""The sandbox side: everything this package runs INSIDE a sandbox, split by process.

Shipped into every sandbox as one file, the zipapp :func:`sandbox_kernel.guest.agent_archive`
builds once per content (a bind mount, an E2B upload, a Modal image layer), where this
package is ``sandbox_kernel_agent``.  It imports only the standard library, ``zmq``,
``jupyter_client`` and, in the interpreter, ipykernel and IPython: never a host-side
module, and only relative imports among its own (``tests/test_guest.py`` holds it to both).

The agent process (PID 1 of the sandbox, the channel's owner; root where the runtime allows):

* :mod:`.main`: the command line (``agent.pyz [--cwd DIR] [--kernel-user USER]``);
* :mod:`.core`: :class:`~.core.Agent`, its loop and op table, the inner kernel's start;
* :mod:`.wire`: its half of the framed stdio protocol (``sandbox_kernel/protocol.py``);
* :mod:`.hardening`: its guard of the channel (non-dumpable, another uid for the interpreter);
* :mod:`.files`: file transfer; :mod:`.egress`: the sandbox's end of egress.

The user's interpreter (``agent.pyz --kernel -f CONN``), :mod:`.interpreter`:

* :mod:`.interpreter.run`: the entry point, stock ipykernel;
* :mod:`.interpreter.patches`: ipykernel's and IPython's patches, each naming its target;
* :mod:`.interpreter.warm`: what is warmed before the first request;
* :mod:`.interpreter.clone`: what a copy of an interpreter redraws (start templates, fork).

The host treats everything the agent says as hostile; the agent trusts the host.
"""
