"""Benchmarks: the numbers a user compares, side by side with stock ipykernel.

Run with ``python bench/run.py`` or ``python -m bench.run`` (``--help`` for the
options). The package, for whoever adds figures or targets:

* ``stats``    -- percentile and summary of samples (pure).
* ``cells``    -- the request timer (``TIMER_SRC``/``Timer``) and the nested-kernel cell.
* ``procmem``  -- memory of a process tree, from ``/proc``.
* ``targets``  -- ``TARGETS``, what is measured: stock ipykernel (the limit), the proxy
  on each local runtime, the emulated cloud backends, the Ray backend on a local
  two-node cluster (``raycluster``: started and stopped by the ``ray`` target).  **Extension point**: add a
  ``Target``, with ``setup``/``teardown`` to start an emulator and install its
  kernelspec; mark emulated services ``emulated=True``; ``figures`` limits which of the
  figures meant for every target measure it.
* ``harness``  -- a run's state (``Bench``), a started kernel (``Running``), what a
  figure function gets (``Context``).
* ``figures/`` -- ``FIGURES``, what is measured on each target: every module in the
  folder registers its figures (``register(name, Figure(...))``) when
  ``bench.figures`` is imported.  ``kind="fresh"`` functions launch their own
  kernels (cold start, memory); ``kind="session"`` functions share one running
  kernel per target.  **Extension point**: a new figure is a new module there.
* ``checks``   -- ``CHECKS``, the performance goals (relay overhead, stdout, warm
  start, freeze and restore latency, checkpointed memory, the fleet, forks, the Ray
  fleet), each a
  function from the results to a verdict (met / missed by how much / not
  measured) and the reason.
* ``results``  -- reading summaries back from the results dict; merging runs.
* ``machine``  -- the machine a run was measured on.
* ``report``, ``why``, ``prose`` -- the plot and ``docs/benchmarks.md``; the prose of
  its "Why" and "Method" sections is in ``explain/*.md`` (``str.format`` templates).
* ``run``      -- the run loop and the command line.
* ``soak``, ``chaos``, ``soak_report`` -- the soak and chaos run of issue 16
  (``python -m bench.soak``): live kernels on both local runtimes, quiet ones timed while
  others misbehave and take faults; ``bench/soak.json``, and its section of
  ``docs/benchmarks.md``.

Every cell sent by the bench is a trivial benchmark cell; on the proxy targets it
runs inside the sandbox, on ``stock`` it runs in the stock kernel, which is the
comparison limit.
"""

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS_JSON = ROOT / "bench" / "results.json"
DOCS_MD = ROOT / "docs" / "benchmarks.md"
DOCS_PNG = ROOT / "docs" / "benchmarks.png"
RUN_LOG = ROOT / "bench" / "run.log"
