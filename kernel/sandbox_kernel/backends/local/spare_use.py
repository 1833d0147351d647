"""A kernel's side of its policy's spare pool (:mod:`.pool.spares`), mixed into
``LocalBackend``: the hold that counts the kernel for the pool, what the pool is started
with, and its start once the kernel's own sandbox is ready (``LocalBackend.on_ready``)."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from typing import TYPE_CHECKING

from .pool import spares
from .pool.wire import policy_key

if TYPE_CHECKING:
    from ...policy import Policy
    from .admission import Admission
    from .sandbox import LocalSandbox


class SpareUse:
    """``LocalBackend``'s use of its policy's spare pool, mixed in."""

    if TYPE_CHECKING:  # what LocalBackend (and its traits, .config) gives
        _sb: LocalSandbox | None
        _spare_hold: int | None
        _spare_seen: bool
        policy: Policy
        python: str
        runtime: str
        runsc_path: str
        gvisor_platform: str
        spare_sandbox: bool
        spare_idle_s: float
        spare_linger_s: float
        spare_pools_max: int
        log: logging.Logger

        @property
        def admission(self) -> Admission: ...
        @property
        def runtime_key(self) -> str: ...

    def _hold_spare(self, key: str) -> None:
        """Count this kernel for its policy's spare pool (:func:`.spares.hold`), once."""
        if self._spare_hold is not None:
            return
        try:
            self._spare_hold, self._spare_seen = spares.hold(key, self.spare_linger_s)
        except OSError as err:
            self.log.warning("spare pool not counted for this kernel: %s", err)

    def _release_spare(self) -> None:
        fd, self._spare_hold = self._spare_hold, None
        if fd is not None:
            spares.release(fd)

    def _spare_spec(self) -> spares.SpareSpec | None:
        """What this kernel's spare pool is started with, or None: :attr:`spare_sandbox`
        off, or its sandbox is its own alone (egress socket, workspace folder).  A spare
        comes before a start template: it is started already."""
        if not self.spare_sandbox or self.policy.network != "none" or self.policy.workspace != "none":
            return None
        return spares.SpareSpec(
            key=policy_key(self.policy, self.runtime_key, self.python), policy=self.policy.sandbox_fields(),
            runtime=self.runtime, runsc_path=self.runsc_path, gvisor_platform=self.gvisor_platform,
            python=self.python, admission=dataclasses.asdict(self.admission), idle_s=self.spare_idle_s,
            linger_s=self.spare_linger_s)

    async def _start_spare_pool(self, spare: spares.SpareSpec, after_s: float) -> None:
        sb = self._sb
        if after_s:
            await asyncio.sleep(after_s)
            if self._sb is not sb:  # ended (or replaced) meanwhile: a one-off kernel
                return
        try:
            if await asyncio.to_thread(spares.ensure, spare, self.spare_pools_max):
                self.log.info("spare pool started for this policy (%s): the next kernel of it takes a "
                              "started sandbox (spare_sandbox)", spare.key)
        except OSError as err:
            self.log.warning("no spare pool started: %s", err)
