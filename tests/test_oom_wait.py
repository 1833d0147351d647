"""``SandboxCgroup.wait_for_oom`` never loses an OOM notification (fast tier, no cgroup).

The chaos run found a gVisor memory bomb reported 30 s late under load: the counter
was read, the OOM came, and the drain of the eventfd before waiting swallowed its
notification.  Here the "kernel" is a test double: the counter and an eventfd the test
writes, at the worst moment (right after the counter was read).
"""

from __future__ import annotations

import asyncio
import os

from sandbox_kernel.backends.local.cgroups import SandboxCgroup


def test_an_oom_right_after_the_counter_was_read_still_wakes_the_waiter(monkeypatch):
    efd = os.eventfd(0, os.EFD_CLOEXEC | os.EFD_NONBLOCK)
    cg = SandboxCgroup("sandbox-kernel-test", {}, 512)
    kills = [0]

    def oom_kills() -> int:
        seen = kills[0]
        if seen == 0:  # the OOM strikes just after this read: counter, then notification
            kills[0] = 1
            os.eventfd_write(efd, 1)
        return seen

    monkeypatch.setattr(cg, "oom_kills", oom_kills)
    monkeypatch.setattr(cg, "_oom_eventfd", lambda: efd)

    async def main() -> None:
        await asyncio.wait_for(cg.wait_for_oom(since=0), 5)  # the fixed wait is 30 s

    asyncio.run(main())
