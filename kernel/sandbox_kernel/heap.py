"""The proxy's freed memory, given back to the system once a big output has passed.

The proxy keeps up to 16 MiB of freed heap for the next output on purpose
(:func:`sandbox_kernel.app.keep_freed_blocks`).  What a big output leaves beyond
that is scattered: nh3's parser builds a tree of many small blocks, about 25
bytes for each byte of HTML, and frees it at once; glibc kept those blocks, and
the proxy stayed 175 MiB larger after one 7 MB table for as long as it lived.
:class:`~sandbox_kernel.channel.AgentChannel` calls :func:`return_freed_memory`
once the sandbox has sent :data:`TRIM_AFTER_BYTES` and then been quiet for
:data:`TRIM_QUIET_S`, so a stream of images keeps its reused blocks while it
flows.
"""

from __future__ import annotations

import ctypes

#: Bytes read from the sandbox since the last trim before one is due.
TRIM_AFTER_BYTES = 4 << 20
#: Seconds of quiet from the sandbox before a due trim runs.
TRIM_QUIET_S = 0.5


def return_freed_memory() -> bool:
    """Return the free pages of every malloc arena to the system (glibc ``malloc_trim(0)``).

    About a millisecond per 100 MiB of heap.

    Returns
    -------
    bool
        Whether glibc released any memory; False without glibc.
    """
    try:
        return bool(ctypes.CDLL(None).malloc_trim(0))
    except (OSError, AttributeError):
        return False
