"""Clone correctness (``guest/agent/interpreter/clone.py`` ``after_clone``, docs/lifecycle.md): what a copy of
an interpreter redraws and what it keeps.  Fast tier: our own guest functions run in a
fresh Python process (so the wrapped ``random.seed`` never leaks into the test process);
no cell code runs.  The sandbox side is ``tests/test_template.py``.
"""

from __future__ import annotations

import json
import subprocess
import sys

SCRIPT = """
import json, multiprocessing, random, sys, tempfile
from sandbox_kernel.guest.agent.interpreter import clone as agent
agent.track_seeds()                     # what run_inner_kernel does at interpreter start
import numpy                            # a cell imports numpy and seeds it at once
if sys.argv[1] == "seeded":
    random.seed(42)
    numpy.random.seed(42)
else:
    random.seed()                       # no seed: still the OS's entropy, still redrawn
    numpy.random.seed(None)
assert getattr(__builtins__, "__import__").__name__ == "__import__"  # the import hook removed itself
state = (random.getstate(), numpy.random.get_state()[1].tolist(), next(tempfile._get_candidate_names()),
         bytes(multiprocessing.current_process().authkey))
agent.after_clone()
after = (random.getstate(), numpy.random.get_state()[1].tolist(), next(tempfile._get_candidate_names()),
         bytes(multiprocessing.current_process().authkey))
print(json.dumps([a == b for a, b in zip(state, after)]))
"""


def _same_after_clone(mode: str) -> list[bool]:
    out = subprocess.run([sys.executable, "-c", SCRIPT, mode], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_unseeded_generators_are_redrawn():
    assert _same_after_clone("unseeded") == [False, False, False, False]


def test_a_seed_the_user_set_is_kept():
    """random.seed(42) and numpy.random.seed(42) continue exactly as seeded; names and the
    authkey are still redrawn."""
    assert _same_after_clone("seeded") == [True, True, False, False]
