"""An agent loop through the client, with no model: a scripted list of steps.

Each step is code an agent would have written; the loop runs it in the
sandboxed kernel, reads what came back (text, tables, figures, errors) and
decides the next step the way an agent would: on an error it runs the step's
fix, on a timeout it goes on with the state kept.  Run it with::

    .venv/bin/python notebooks/agent_loop.py                    # kernelspec sandbox-local
    .venv/bin/python notebooks/agent_loop.py --kernel sandbox-e2b

Every cell runs inside the kernel's sandbox, never in this process.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass

from sandbox_kernel import Sandbox


@dataclass
class Step:
    """One thing the scripted agent wants done; ``fix`` is what it tries after an error."""

    goal: str
    code: str
    fix: str | None = None
    timeout_s: float | None = 60


STEPS = [
    Step("inspect the sandbox", "import platform, os\nprint(platform.python_version(), os.getcwd())"),
    Step("make data", "import numpy as np, pandas as pd\n"
         "rng = np.random.default_rng(0)\n"
         "df = pd.DataFrame({'x': np.arange(50), 'y': rng.normal(size=50).cumsum()})\ndf.describe()"),
    Step("fit a line (first try has a typo)", "slope, icept = np.polyfitt(df.x, df.y, 1)",
         fix="slope, icept = np.polyfit(df.x, df.y, 1)\nround(slope, 4)"),
    Step("plot it", "import matplotlib.pyplot as plt\n"
         "plt.plot(df.x, df.y, label='data'); plt.plot(df.x, slope * df.x + icept, label='fit')\n"
         "plt.legend(); plt.show()"),
    Step("a step that hangs (the agent gives it 2 s)", "import time\ntime.sleep(600)", timeout_s=2),
    Step("the state survived the timeout", "len(df), round(slope, 4)"),
]


def describe(ex) -> str:
    """What the agent 'reads' back: one line per output."""
    lines = []
    if ex.stdout:
        lines.append(f"stdout: {ex.stdout.strip()[:200]}")
    for r in ex.results:
        if r.png:
            lines.append(f"figure: {len(r.png)} bytes of PNG")
        elif r.html:
            lines.append(f"table: {len(r.html)} characters of HTML; text: {(r.text or '').splitlines()[0]}")
        else:
            lines.append(f"result: {r.text}")
    if ex.error:
        lines.append(f"error: {ex.error.ename}: {ex.error.evalue}")
    return "\n    ".join(lines) or "(no output)"


def run(kernel: str) -> int:
    """Run :data:`STEPS`; return 0 if every step (or its fix) ended without an unexpected error."""
    failures = 0
    with Sandbox(kernel) as sbx:
        info = sbx.info()
        print(f"sandbox: backend={info.backend}, boundary={info.boundary}, egress={info.egress}")
        for i, step in enumerate(STEPS, 1):
            ex = sbx.run(step.code, timeout=step.timeout_s)
            print(f"[{i}] {step.goal} ({ex.duration_s:.2f} s)\n    {describe(ex)}")
            if ex.error and step.fix:
                ex = sbx.run(step.fix, timeout=step.timeout_s)
                print(f"    fixed: {describe(ex)}")
            if ex.error and not ex.error.timed_out:
                failures += 1
    return 1 if failures else 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kernel", default="sandbox-local", help="kernelspec (default: sandbox-local)")
    sys.exit(run(parser.parse_args().kernel))
