"""Clone correctness: the ONE place for what a copy of an interpreter (a start template's
restore, and issue 30's fork and rewind) redraws, keeps, and cannot change.
``docs/lifecycle.md`` holds the table.

Runs inside the user's interpreter; the agent only sends :data:`RESEED_SIGNAL`.
"""

from __future__ import annotations

import builtins
import os
import signal
import sys
import tempfile

#: Sent by the agent to the interpreter restored from a start template (the host's
#: ``reseed``): :func:`after_clone`.
RESEED_SIGNAL = signal.SIGUSR2
_USER_SEEDED: set[str] = set()  # "random", "numpy": seeded by the user since start


def track_seeds() -> None:
    """Note from now on when the user seeds ``random`` or numpy's legacy generator.

    Called by :func:`run_inner_kernel` at interpreter start and by
    :func:`after_clone`; wraps ``random.seed``/``setstate`` (and
    ``numpy.random.seed``/``set_state`` right after the import that loads numpy,
    through a ``builtins.__import__`` wrapper that removes itself then) so that
    an explicit, non-``None`` seed marks the generator as the user's.
    """
    import random

    def wrap(mod, name, key, explicit):
        fn = getattr(mod, name, None)
        if fn is None or getattr(fn, "_sbk_tracked", False):
            return

        def tracked(*args, **kwargs):
            if explicit(args, kwargs):
                _USER_SEEDED.add(key)
            return fn(*args, **kwargs)
        tracked._sbk_tracked = True  # type: ignore[attr-defined]
        setattr(mod, name, tracked)

    def seeded(args, kwargs):
        return (args[0] if args else kwargs.get("a", kwargs.get("seed"))) is not None

    wrap(random, "seed", "random", seeded)
    wrap(random, "setstate", "random", lambda a, k: True)

    def wrap_numpy() -> bool:
        legacy = sys.modules.get("numpy.random")
        if legacy is None or not hasattr(legacy, "set_state"):  # absent, or half imported
            return False
        wrap(legacy, "seed", "numpy", seeded)
        wrap(legacy, "set_state", "numpy", lambda a, k: True)
        return True

    if wrap_numpy() or getattr(builtins.__import__, "_sbk_tracked", False):
        return
    original = builtins.__import__

    def importing(*args, **kwargs):  # until numpy.random is loaded, then gone
        module = original(*args, **kwargs)
        if builtins.__import__ is importing and wrap_numpy():
            builtins.__import__ = original
        return module
    importing._sbk_tracked = True  # type: ignore[attr-defined]
    builtins.__import__ = importing


def after_clone(*_args) -> None:
    """Make this interpreter its own after it was copied (restore from a start
    template; fork or rewind, issue 30), from ``os.urandom``.

    Called in the interpreter by :data:`RESEED_SIGNAL` (the agent's ``reseed`` op).
    Redrawn: ``random``'s global generator and numpy's legacy global
    ``RandomState`` unless the user seeded them (:func:`track_seeds`), tempfile's
    name sequence, multiprocessing's ``current_process().authkey``.  Fine as they
    are: ``secrets``, ``random.SystemRandom``, ``uuid.uuid4`` (``os.urandom`` per
    call), ``numpy.random.default_rng()`` (seeded per call).  Cannot change in a
    live interpreter: ``hash()`` randomisation (``PYTHONHASHSEED``), so copies
    share str/bytes hash order.  Clocks are the runtime's: gVisor restores keep
    ``CLOCK_MONOTONIC`` going forward and ``time.time()`` is the host's.

    Parameters
    ----------
    *_args
        The signal number and frame when called as a signal handler; ignored.
    """
    import random

    if "random" not in _USER_SEEDED:
        random.seed()
    tempfile._name_sequence = None  # type: ignore[attr-defined]  # remade, freshly seeded, at the next name
    legacy = sys.modules.get("numpy.random")
    if legacy is not None and "numpy" not in _USER_SEEDED:
        try:
            legacy.seed()
        except Exception:  # noqa: BLE001 - a numpy without the legacy generator
            pass
    mp = sys.modules.get("multiprocessing.process")
    if mp is not None:
        mp.current_process().authkey = os.urandom(32)
    track_seeds()
