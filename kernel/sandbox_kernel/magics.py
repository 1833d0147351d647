"""Cells the proxy answers itself: ``%snapshot``, ``%snapshots`` and ``%rewind <id>``.

A notebook user has no agent client and no control channel of their own: these three
line magics give them the kernel's snapshots (issue 30, :mod:`.snapshots`).  A cell
whose whole code is one of them (blank lines and spaces around allowed) is answered by
the proxy and never reaches the sandbox's interpreter, so nothing in the user's
namespace can fake or see it; any other cell, ``%snapshot`` inside a larger cell
included, is the interpreter's as always (where IPython says the magic is unknown).

* ``%snapshot``: keep the kernel's whole state under a new id; prints the id, its size
  and the line that rewinds to it.
* ``%snapshots``: the snapshots kept, oldest first.
* ``%rewind <id>``: the kernel back to that snapshot, in place (the inner kernel's
  execution count with it).

A refusal (bubblewrap, an unknown id, another snapshot under way...) is the cell's error,
named as the control message's reply names it; the running kernel is untouched.  The
cell's ``execution_count`` is the last one the interpreter gave (its counter does not
move for a cell it never ran).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from .cells import error_line

if TYPE_CHECKING:
    from .kernel_face import KernelFace
    from .snapshots import Snapshots

#: A cell that is exactly one of the proxy's magics; group 1 the verb, group 2 its argument.
MAGIC = re.compile(r"\A\s*%(snapshot|snapshots|rewind)(?:[ \t]+(\S+))?[ \t]*\s*\Z")
#: How each magic is used, for the error of a wrong use.
USAGE = {"snapshot": "%snapshot", "snapshots": "%snapshots", "rewind": "%rewind <snapshot id>"}


def match(code: object) -> tuple[str, str | None] | None:
    """``(verb, argument)`` if ``code`` is one of the proxy's magics, else None."""
    if not isinstance(code, str):
        return None
    m = MAGIC.match(code)
    return (m.group(1), m.group(2)) if m else None


async def run(kernel: KernelFace, snapshots: Snapshots, parent: dict[str, Any], verb: str,
              arg: str | None, execution_count: int) -> dict[str, Any]:
    """Answer a magic cell, on the proxy's main loop: its ``execute_input``, its output
    (a stdout stream) or its ``error`` on IOPub; the ``execute_reply`` content returned.

    Parameters
    ----------
    kernel : KernelFace
        The proxy: what it publishes goes under ``parent``.
    snapshots : Snapshots
        The kernel's snapshots (:mod:`.snapshots`), one operation at a time.
    parent : dict
        The ``execute_request``.
    verb, arg : str
        From :func:`match`.
    execution_count : int
        The interpreter's last execution count.

    Returns
    -------
    dict
        ``execute_reply`` content: ``status`` ``ok``, or ``error`` with ``ename``
        (``SnapshotUnsupported``, ``UnknownSnapshot``, ``RestoreInProgress``,
        ``UsageError``...), ``evalue`` and ``traceback``.
    """
    code = parent["content"].get("code", "")
    if not parent["content"].get("silent"):
        kernel.publish("execute_input", {"code": code, "execution_count": execution_count}, parent)
    base = {"execution_count": execution_count, "user_expressions": {}, "payload": []}
    result: dict[str, Any]
    if (verb == "rewind") != (arg is not None):
        result = {"status": "error", "ename": "UsageError", "evalue": f"usage: {USAGE[verb]}"}
    elif verb == "snapshot":
        result = await snapshots.run_one("snapshot", snapshots.take)
    elif verb == "rewind":
        result = await snapshots.run_one("restore", lambda: snapshots.rewind(arg, told_in_cell=True))
    else:
        result = {"status": "ok", "snapshots": [s.public() for s in snapshots.kept.values()]}
    if result["status"] != "ok":
        error = {"status": "error", "ename": result["ename"], "evalue": result["evalue"],
                 "traceback": [error_line(result["ename"], result["evalue"])]}
        kernel.publish("error", error, parent)
        return {**base, **error}
    kernel.publish("stream", {"name": "stdout", "text": _text(verb, result)}, parent)
    return {**base, "status": "ok"}


def _text(verb: str, result: dict[str, Any]) -> str:
    """What a magic prints."""
    if verb == "snapshots":
        kept = result["snapshots"]
        if not kept:
            return "no snapshots of this kernel (take one with %snapshot)\n"
        return "".join(f"{s['id']}  {s['created']}  {s['size_mib']:.1f} MiB\n" for s in kept)
    snap = result["snapshot"]
    if verb == "rewind":
        return f"rewound to snapshot {snap['id']} (taken {snap['created']}): what ran after it is undone\n"
    removed = "".join(f"(snapshot {r} removed: snapshots_max)\n" for r in result.get("removed", []))
    return (f"snapshot {snap['id']} taken ({snap['size_mib']:.1f} MiB); "
            f"%rewind {snap['id']} brings this kernel back to now\n{removed}")
