"""Real public notebooks through nbclient on the sandboxed kernel, compared with a stock run.

The notebooks and their baselines live in ``../shared/notebooks`` beside the checkout (see its
MANIFEST.md; they are used in place, never copied here).  Each baseline is the
notebook executed by a stock ipykernel 7.4 with nbclient: 120 s per cell,
``allow_errors``, no stdin, a fresh empty working directory.  We execute the
same notebook the same way through the installed sandbox kernelspec and compare
cell by cell: output types, stream names and text, MIME types, ``text/plain``,
the visible text of HTML, error names.  Only what is truly nondeterministic or
inherent to running in a sandbox is normalised; each normalisation below says
why.

The full set runs on gVisor (the default runtime); a handful of notebooks that
exercise comms, widgets, display updates and the shell also run on bubblewrap.
"""

from __future__ import annotations

import copy
import json
import os
import re
import sys
from pathlib import Path

import nbformat
import pytest
from kernels import IpcKernelManager, kernel_name_for
from sandbox_kernel.nbrun import NotebookRunner

#: ``shared/`` sits beside the checkout (as in CI: a copy of shared/ beside the clone).
NB_DIR = Path(os.environ.get("SANDBOX_KERNEL_NOTEBOOKS")
              or Path(__file__).resolve().parent.parent.parent / "shared" / "notebooks")
BASELINE_DIR = NB_DIR / "baseline"
NOTEBOOKS = sorted(p.name for p in NB_DIR.glob("*.ipynb"))
if not NOTEBOOKS:
    raise RuntimeError(f"no notebooks in {NB_DIR}: the shared/ folder must sit beside the checkout "
                       "(or set SANDBOX_KERNEL_NOTEBOOKS)")
BWRAP_SUBSET = (
    "ipywidgets__Widget_Events.ipynb",
    "nbclient__Clear_Output.ipynb",
    "nbclient__Other_Comms.ipynb",
    "nbclient__update-display-id.ipynb",
    "ipython__Beyond_Plain_Python.ipynb",
)

#: Working directory of the stock run (the baseline's fresh empty directory).
BASELINE_CWD = "/home/user/work"
#: Working directory inside the sandbox (backends/local/layout.py: SANDBOX_HOME).
SANDBOX_CWD = "/home/sandbox"
#: Python environments: the baseline machine's, and ours (sys.prefix, sys.base_prefix).
PYTHON_ENV_DIRS = ("/opt/venv", sys.prefix, sys.base_prefix)

pytestmark = pytest.mark.skipif(not NB_DIR.is_dir(), reason=f"{NB_DIR} not present")


# ---------------------------------------------------------------------------
# Normalisation
# ---------------------------------------------------------------------------

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_ADDR = re.compile(r"0x[0-9a-fA-F]{6,16}")
# %timeit / %%timeit: every number of its report is a measurement.
_TIMEIT = re.compile(r"[0-9.,]+ (?:ns|µs|μs|us|ms|s) ± [0-9.,]+ (?:ns|µs|μs|us|ms|s) per loop "
                     r"\(mean ± std\. dev\. of [0-9,]+ runs?, [0-9,]+ loops? each\)")
# %%time / %time
_TIME = re.compile(r"(CPU times|Wall time): [^\n]*")
# IPython names the file of each cell /tmp/ipykernel_<pid>/<hash>.py.
_CELL_FILE = re.compile(r"/tmp/ipykernel_\d+/\d+\.py")
# Widget model ids are fresh uuids per run.
_MODEL_ID = re.compile(r"\b[0-9a-f]{32}\b")


# Floating-point round-off: a value that is zero in exact arithmetic prints as
# ~1e-15 or ~1e-16 depending on the BLAS kernel and CPU (np.linalg.eigvals).
_ROUNDOFF = re.compile(r"-?\d\.\d+e-(?:1[3-9]|[2-9]\d)")
_NUMBER = re.compile(r"-?\d+(?:\.\d*)?(?:e[-+]?\d+)?")


def norm_text(text: str) -> str:
    text = _ANSI.sub("", text)
    text = _ROUNDOFF.sub("<~0>", text)
    text = text.replace("\r\n", "\n")
    text = _TIMEIT.sub("<timeit>", text)
    # %timeit's own warning about run-to-run spread (a timing, too).
    text = re.sub(r"The slowest run took [0-9.,]+ times longer than the fastest\. This could mean "
                  r"that an intermediate result is being cached\.\n", "", text)
    text = _TIME.sub(r"\1: <time>", text)
    text = _CELL_FILE.sub("<cell-file>", text)
    text = _ADDR.sub("0x<addr>", text)
    # Host-dependent path: the working directory (a fresh directory on the
    # host for the stock run, the sandbox's scratch home here).
    text = text.replace(BASELINE_CWD, "<cwd>").replace(SANDBOX_CWD, "<cwd>")
    # Host-dependent path: the Python environment (bound read-only at its own
    # host path inside; /opt/venv on the machine that made the baseline).
    for env_dir in PYTHON_ENV_DIRS:
        text = text.replace(env_dir + "/", "<python-env>/")
    return text


def html_visible_text(html: str) -> str:
    """The text a reader sees: scripts and styles removed, tags dropped, spaces collapsed.

    Attribute and style details may legitimately change under the sanitising
    output policy (docs/security.md: HTML is sanitised); the content may not.
    """
    html = re.sub(r"(?is)<(script|style)\b.*?</\1\s*>", "", html)
    html = re.sub(r"(?s)<[^>]*>", " ", html)
    return " ".join(norm_text(html).split())


def _stream_key(name: str, text: str) -> tuple:
    return ("stream", name, norm_text(text))


def summarise(outputs: list[dict]) -> list[tuple]:
    """Comparable summary of one cell's outputs; consecutive streams merged."""
    out: list[tuple] = []
    for o in outputs:
        t = o["output_type"]
        if t == "stream":
            if out and out[-1][0] == "stream" and out[-1][1] == o["name"]:
                out[-1] = _stream_key(o["name"], out[-1][3] + o["text"]) + (out[-1][3] + o["text"],)
            else:
                out.append(_stream_key(o["name"], o["text"]) + (o["text"],))
        elif t == "error":
            out.append(("error", o["ename"]))
        else:
            data = o.get("data", {})
            item: dict = {"mimes": tuple(sorted(data))}
            if "text/plain" in data:
                item["text/plain"] = norm_text(_join(data["text/plain"]))
            if "text/html" in data:
                item["text/html"] = html_visible_text(_join(data["text/html"]))
            for img in ("image/png", "image/jpeg"):
                if img in data:
                    # Image bytes vary with fonts/versions; keep the type and a size bucket.
                    item[img] = _size_mark(len(_join(data[img])))
            if "image/svg+xml" in data:
                item["image/svg+xml"] = _size_mark(len(_join(data["image/svg+xml"])))
            view = data.get("application/vnd.jupyter.widget-view+json")
            if view is not None:
                item["widget-view"] = sorted(k for k in view)
            out.append((t, json.dumps(item, sort_keys=True)))
    return [o[:3] if o[0] == "stream" else o for o in out]


def _join(v) -> str:
    return "".join(v) if isinstance(v, list) else str(v)


def _size_mark(n: int) -> str:
    """Image size, compared within a factor (see :func:`same_summary`), never byte for byte."""
    return f"<image of {n} bytes>"


_SIZE_MARK = re.compile(r"<image of (\d+) bytes>")
#: Image bytes depend on fonts, library versions and (e.g. histograms of
#: unseeded random draws) on the data: sizes must agree within this factor.
IMAGE_SIZE_FACTOR = 3.0


def same_summary(exp: list[tuple], act: list[tuple]) -> bool:
    """Equal, except image sizes which need only agree within IMAGE_SIZE_FACTOR."""
    ej, aj = json.dumps(exp), json.dumps(act)
    if _SIZE_MARK.sub("<image>", ej) != _SIZE_MARK.sub("<image>", aj):
        return False
    for e, a in zip(_SIZE_MARK.findall(ej), _SIZE_MARK.findall(aj)):
        e, a = int(e), int(a)
        if (e == 0) != (a == 0) or max(e, a) > IMAGE_SIZE_FACTOR * max(1, min(e, a)):
            return False
    return True


def code_cells(nb) -> list:
    return [c for c in nb.cells if c.cell_type == "code"]


# ---------------------------------------------------------------------------
# The output policy's promise ("sanitize", the default)
# ---------------------------------------------------------------------------


def is_policy_notice(o: dict) -> bool:
    """The one-line notice the firewall emits (stderr) when it removes something."""
    return (o["output_type"] == "stream" and o["name"] == "stderr"
            and o["text"].startswith("sandbox-kernel: removed"))


#: What ``output_policy=sanitize`` promises (docs/security.md, outputs/): these
#: types pass (HTML, SVG and MathML sanitised, Markdown and LaTeX checked, charts
#: checked), script types and every other type are removed, with a notice; a
#: ``display_data`` left with nothing (or only IPython's default ``<... object>``
#: repr) is not shown, any other output left empty gets a ``text/plain`` notice.
def _passes_sanitize(mime: str) -> bool:
    from sandbox_kernel.outputs import SAFE_TYPES, SCRIPT_TYPES

    mime = mime.split(";")[0].strip().lower()
    if mime in SCRIPT_TYPES:
        return False
    from sandbox_kernel.outputs import PLOTLY_TYPE, VEGA_TYPES

    return (mime in SAFE_TYPES or mime in ("text/html", "image/svg+xml", "text/markdown", "text/latex",
                                          "application/mathml+xml")
            or mime in VEGA_TYPES or mime == PLOTLY_TYPE)


NOTICE_BUNDLE = "<output-policy notice>"


def apply_sanitize_promise(outputs: list[dict]) -> tuple[list[dict], bool]:
    """What the baseline's outputs become under ``output_policy=sanitize``.

    Returns the outputs and whether the policy had to act (then a notice is promised).
    """
    acted = False
    result = []
    for o in outputs:
        o = copy.deepcopy(o)
        data = o.get("data")
        if data is not None:
            removed = False
            for mime in list(data):
                if not _passes_sanitize(mime):
                    del data[mime]
                    acted = removed = True
                elif mime == "application/mathml+xml":
                    # kept, through the presentation allowlist: markup outside it (MathJax's
                    # class names here) is removed with a notice
                    from sandbox_kernel.outputs.html import clean_mathml
                    acted = acted or bool(clean_mathml(_join(data[mime]))[1])
            if removed and o["output_type"] == "display_data" and (
                    not data or (list(data) == ["text/plain"]
                                 and re.fullmatch(r"<[\w.]+ object(?: at 0x[0-9a-fA-F]+)?>",
                                                  _join(data["text/plain"]).strip()))):
                continue  # nothing of it left to show: only the stderr notice says so
            # <script> is removed, with a notice; a <style> block keeps the rules for the
            # output's own classes (pandas' all are) and is compared by the text a reader sees.
            if "text/html" in data and re.search(r"(?i)<script\b", _join(data["text/html"])):
                data["text/html"] = re.sub(r"(?is)<script\b.*?</script\s*>", "", _join(data["text/html"]))
                acted = True
            if not data:
                data["text/plain"] = NOTICE_BUNDLE
        result.append(o)
    return result, acted


def mark_notice_bundles(outputs: list[dict]) -> list[dict]:
    out = []
    for o in outputs:
        data = o.get("data")
        if data is not None and list(data) == ["text/plain"] and \
                _join(data["text/plain"]).startswith("sandbox-kernel: "):
            o = {**o, "data": {"text/plain": NOTICE_BUNDLE}}
        out.append(o)
    return out


# ---------------------------------------------------------------------------
# Narrow, documented exceptions inherent to sandboxing
# ---------------------------------------------------------------------------


_RANDOM_CALL = re.compile(r"\brandom\.(?:random|rand|randn|randint|normal|uniform|choice|permutation)\(")


def unseeded_random(source: str, earlier: str) -> bool:
    """The cell draws random numbers and the notebook never set a seed before it."""
    return bool(_RANDOM_CALL.search(source)) and "seed(" not in earlier + source


def inherent(name: str, idx: int, source: str) -> str | None:
    """Why this cell's output legitimately differs from the stock run, or None."""
    if name == "ipywidgets__Widget_Styling.ipynb" and "defaultdict(set)" in source:
        # The table's rows and columns follow the iteration order of sets of
        # str, which PYTHONHASHSEED randomises per process: compare the words.
        return "set-order"
    if source.lstrip().startswith("!"):
        # `!cmd` runs without a pseudo-terminal inside (agent._system; cases
        # C08/C09: a pty hangs commands that read stdin and splits UTF-8): its
        # lines end in "\n", not the terminal's "\r\n", and what a command prints
        # for a terminal (colours, progress) differs.
        return "no-pty"
    if name == "ipython__Background_Jobs.ipynb":
        # Jobs sleep 1-4 s and printfunc(1,3) prints from its thread every second, into
        # whatever cell runs then.  The stock run went through every cell within a
        # second; how many jobs have finished by a later cell depends on how long the
        # cells before it took (CI, loaded: job 1 finished before jobs.flush()).
        # Timing, not content: see _job_timing.
        return "background-jobs"
    if name == "ipython__Beyond_Plain_Python.ipynb":
        if source.startswith("%%bash") and "df -h" in source:
            # `df -h` lists the mount table: the host's for the stock run, the
            # sandbox's (tmpfs home, read-only binds) here.
            return "df"
        if source.strip() == "%connect_info":
            # Shows the *inner* kernel's connection file (IPC transport, its own
            # key) inside the sandbox; ports and keys are per-run anyway.
            return "connect_info"
    return None


def _numbers_out(summary: list[tuple]) -> list[tuple]:
    # numpy pads columns to the widest value: spacing follows the values too.
    return [tuple(re.sub(r"[ \t]+", "", _NUMBER.sub("<num>", x)) if isinstance(x, str) else x
                  for x in item) for item in summary]


def _words_sorted(summary: list[tuple]) -> list[tuple]:
    return [tuple(" ".join(sorted(x.split())) if isinstance(x, str) else x for x in item) for item in summary]


def _streams_merged(summary: list[tuple]) -> list[tuple]:
    text = "".join(item[2] for item in summary if item[0] == "stream")
    rest = [item for item in summary if item[0] != "stream"]
    return ([("stream", "stdout+stderr", text)] if text else []) + rest


_JOB_ENTRY = re.compile(r"^\d+ : .*\n", re.M)
_JOB_GROUP = re.compile(r"^(?:Running|Completed|Dead) jobs:\n", re.M)


def _job_timing(exp: list[tuple], act: list[tuple]) -> tuple[list[tuple], list[tuple]]:
    """ipython__Background_Jobs, compared up to which timed jobs have finished.

    Masked in both runs: printfunc's lines (they land in whatever cell runs), a
    flush's count, diejob1's state word and what its ``traceback()`` prints (None
    while it runs, its traceback once dead), ``jobs.traceback()``'s blocks, and
    ``jobs[0].result`` (not completed, or its dict).  A status listing may lack
    jobs the stock listing shows (finished and flushed since) and must not show
    others: checked here, then the listings are dropped from both.
    """
    def mask(summary: list[tuple]) -> list[tuple]:
        out = []
        for item in summary:
            if item[0] == "stream":
                text = re.sub(r"In the background\.\.\. \d+\n|All done!\n", "", item[2])
                text = re.sub(r"(?:(?:No jobs to flush|Flushing \d+ \w+ jobs?)\.\n)+", "<flush>\n", text)
                text = re.sub(r"(Status of diejob1: )\w+\n[\s\S]*", r"\1<state and traceback>\n", text)
                text = re.sub(r"Traceback for: [\s\S]*", "", text)
                if not text:
                    continue
                item = (item[0], item[1], text)
            elif item[0] == "execute_result":
                item = (item[0], re.sub(r"""'<BackgroundJob has not completed>'|\{'interval': [^"]*\}""",
                                        "<result>", item[1]))
            out.append(item)
        return out

    exp, act = mask(exp), mask(act)
    listed = [set(_JOB_ENTRY.findall("".join(i[2] for i in s if i[0] == "stream"))) for s in (exp, act)]
    if listed[1] <= listed[0]:
        def unlisted(summary: list[tuple]) -> list[tuple]:
            return [(i[0], i[1], _JOB_GROUP.sub("", _JOB_ENTRY.sub("", i[2]))) if i[0] == "stream" else i
                    for i in summary]
        exp, act = unlisted(exp), unlisted(act)
    return exp, act


def compare_cell(name: str, idx: int, source: str, expected: list[dict], actual: list[dict],
                 earlier: str = "") -> list[str]:
    problems: list[str] = []
    expected, acted = apply_sanitize_promise(expected)
    notices = [o for o in actual if is_policy_notice(o)]
    actual = mark_notice_bundles([o for o in actual if not is_policy_notice(o)])
    if acted and not notices:
        problems.append(f"cell {idx}: output policy removed script content without a notice")
    if notices and not acted:
        problems.append(f"cell {idx}: unexpected output-policy notice: {notices[0]['text']!r}")
    for o in actual:
        data = o.get("data") or {}
        if "application/javascript" in data or re.search(r"(?i)<script", _join(data.get("text/html", ""))):
            problems.append(f"cell {idx}: script-capable output passed the sanitize policy")
    why = inherent(name, idx, source)
    exp, act = summarise(expected), summarise(actual)
    if why == "df":
        exp, act = exp[:1], act[:1]  # the first stream ("My shell is ... My disk usage is:")
        exp = [(e[0], e[1], e[2].split("Filesystem")[0]) for e in exp]
        act = [(a[0], a[1], a[2].split("Filesystem")[0]) for a in act]
    elif why == "connect_info":
        exp = [(e[0], e[1], "<connection info>") if e[0] == "stream" else e for e in exp]
        act = [(a[0], a[1], "<connection info>") if a[0] == "stream" else a for a in act]
    elif why == "no-pty":
        exp, act = _streams_merged(exp), _streams_merged(act)
    elif why == "set-order":
        exp, act = _words_sorted(exp), _words_sorted(act)
    elif why == "background-jobs":
        exp, act = _job_timing(exp, act)
    if unseeded_random(source, earlier):
        # Random draws without a seed: the values differ run to run; shapes,
        # types and the rest of the text must not.
        exp, act = _numbers_out(exp), _numbers_out(act)
    if not same_summary(exp, act):
        problems.append(f"cell {idx} ({source[:50]!r}):\n  expected {exp!r}\n  actual   {act!r}")
    return problems


# ---------------------------------------------------------------------------
# Running
# ---------------------------------------------------------------------------


def run_notebook(name: str, kernel_name: str, tmp_path: Path):
    nb = nbformat.read(NB_DIR / name, as_version=4)
    workdir = tmp_path / "work"
    workdir.mkdir()
    client = NotebookRunner(nb, timeout=120, kernel_name=kernel_name, allow_errors=True,
                            kernel_manager_class=IpcKernelManager,
                            resources={"metadata": {"path": str(workdir)}})
    client.execute()
    return nb


def host_leaks(nb, tmp_path: Path) -> list[str]:
    """Strings from the host that must not appear in what the sandbox produced.

    The Python environment is bound read-only at its own host path (here
    ``sys.prefix`` is the checkout's ``.venv`` and ``sys.base_prefix`` lives
    under ``/root/.pyenv``), so tracebacks legitimately name files there; any
    other host path (the checkout itself, the host working directory, other
    entries of ``/root``) must not show up.
    """
    # a stream arrives in pieces cut anywhere (a path split over two outputs would hide
    # from the replacement below and show as a bare prefix): each cell's streams joined
    outputs = []
    for c in code_cells(nb):
        streams: dict[str, str] = {}
        for o in c.get("outputs", []):
            if o.get("output_type") == "stream":
                streams[o.get("name", "")] = streams.get(o.get("name", ""), "") + "".join(o.get("text", ""))
            else:
                outputs.append(o)
        outputs.append(streams)
    text = json.dumps(outputs)
    for env_dir in {sys.prefix, sys.base_prefix, os.path.realpath(sys.prefix)}:
        text = text.replace(env_dir, "<python-env>")
    leaks = []
    nodename = os.uname().nodename
    needles = [str(Path(__file__).resolve().parents[1]), str(tmp_path), "/root/.bashrc",
               "/root/.cache", "/root/.ssh", "/work/"]
    for needle in needles:
        if needle in text:
            leaks.append(needle)
    if len(nodename) >= 4 and re.search(rf"\b{re.escape(nodename)}\b", text):
        leaks.append(f"hostname {nodename}")
    for m in re.findall(r"/root/[^\s\"\\']*", text):
        if not m.startswith("/root/.pyenv"):
            leaks.append(m)
    return leaks


def check(name: str, kernel_name: str, tmp_path: Path) -> None:
    baseline = nbformat.read(BASELINE_DIR / name, as_version=4)
    nb = run_notebook(name, kernel_name, tmp_path)
    exp_cells, act_cells = code_cells(baseline), code_cells(nb)
    assert len(exp_cells) == len(act_cells)
    problems: list[str] = []
    for i, (e, a) in enumerate(zip(exp_cells, act_cells)):
        earlier = "\n".join(c.source for c in act_cells[:i])
        problems += compare_cell(name, i, a.source, e.get("outputs", []), a.get("outputs", []), earlier)
    leaks = host_leaks(nb, tmp_path)
    if leaks:
        problems.append(f"host content in the executed notebook: {leaks}")
    assert not problems, f"{name}: {len(problems)} cell(s) differ from the stock run:\n" + "\n".join(problems)


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_notebook_matches_stock_run_gvisor(name, kernelspec_prefix, tmp_path):
    check(name, kernel_name_for("gvisor"), tmp_path)


@pytest.mark.parametrize("name", BWRAP_SUBSET)
def test_notebook_matches_stock_run_bubblewrap(name, kernelspec_prefix, tmp_path):
    check(name, kernel_name_for("bubblewrap"), tmp_path)
