"""JupyterLab with the sandbox kernel beside the stock one, as a user works (issue 18).

One script of user steps runs in JupyterLab (headless Chromium, Playwright) on
a notebook using "Python 3 (sandbox: local)" on gVisor, then on the same
notebook with the stock ipykernel ("Python 3 (ipykernel)"), and what the user
sees is compared: the first Tab completes within JupyterLab's completion
timeout, state across cells, a DataFrame table whose cells align the same, a
plot, a slider moved with the keyboard changes the Python value, ``input()``,
the Stop button keeps state, the debugger stops at a breakpoint and shows the
locals, a restart shows the states the stock kernel shows and logs no traceback
on the server.
Script output is the one intended difference: inert with a notice in the
sandbox.  A screenshot per step is kept under ``out/browser/<kernel>/``
(``SANDBOX_KERNEL_ARTIFACTS`` overrides) as a CI artifact.

The stock kernel is the reference a user compares with, and its cells are
cell code too: it runs jailed in bubblewrap (the filesystem read-only, an
empty environment, its own writable tmpfs), unchanged otherwise (stock ipykernel speaking
ZMQ to JupyterLab on loopback, so it keeps the host's network namespace).
Every cell of the sandbox kernel runs in gVisor.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

import pytest
from kernels import kernel_name_for

from .lab import ARTIFACTS, LabNotebook, panel_js

STOCK = "stock-jailed"
SANDBOX = kernel_name_for("gvisor")
DEBUG_CELL = "def f(a, b):\n    c = a + b\n    return c\nprint(f(2, 3))"

def _first_tab(nb: LabNotebook) -> dict:
    """Tab in a fresh kernel's first cell: the completer must show within JupyterLab's timeout
    (replies later than its provider timeout are dropped and nothing appears)."""
    nb.new_cell("import collections\ncollections.Ord", "tab")
    nb.page.click("[data-fidelity=tab] .cm-content")
    nb.page.keyboard.press("Control+End")
    t0 = time.monotonic()
    nb.page.keyboard.press("Tab")
    try:
        nb.page.wait_for_selector(".jp-Completer:not(.lm-mod-hidden) .jp-Completer-item", timeout=10_000)
        items = nb.page.eval_on_selector_all(".jp-Completer-item", "els => els.map(e => e.innerText.trim())")
    except Exception:
        items = []
    elapsed = time.monotonic() - t0
    nb.shot("first-tab")
    nb.page.keyboard.press("Escape")
    nb.page.evaluate(panel_js("p.content.activeCell.model.sharedModel.setSource('');"))
    return {"completes": any("OrderedDict" in i for i in items), "within_s": round(elapsed, 2)}


def _state(nb: LabNotebook) -> str:
    nb.run("x = 41", "state1")
    out = nb.text(nb.run("x + 1", "state2"))
    nb.shot("state")
    return out


def _table(nb: LabNotebook) -> dict:
    nb.run("import pandas as pd\npd.DataFrame({'n': [1, 22, 333], 's': ['a', 'bb', 'ccc'], "
           "'f': [0.5, 12.25, 3.0]})", "table")
    cells = nb.page.eval_on_selector_all(
        "[data-fidelity=table] .jp-OutputArea-output table td, [data-fidelity=table] .jp-OutputArea-output table th",
        "els => els.map(e => [e.innerText.trim(), getComputedStyle(e).textAlign, getComputedStyle(e).verticalAlign])")
    nb.shot("table")
    return {"cells": cells}


def _plot(nb: LabNotebook) -> dict:
    nb.run("import matplotlib.pyplot as plt\nplt.plot([1, 3, 2]); plt.title('t'); plt.show()", "plot")
    nb.page.wait_for_selector("[data-fidelity=plot] .jp-OutputArea-output img", timeout=30_000)
    size = nb.page.eval_on_selector("[data-fidelity=plot] .jp-OutputArea-output img",
                                    "img => [img.complete, img.naturalWidth > 100, img.naturalHeight > 100]")
    nb.shot("plot")
    return {"image": size}


#: Half a second of 32x32 red, H.264 in MP4 (ffmpeg: ``-f lavfi -i color=c=red:s=32x32:d=0.5:r=4
#: -c:v libx264 -pix_fmt yuv420p -movflags +faststart``), 1584 bytes.
MP4_B64 = ("AAAAIGZ0eXBpc29tAAACAGlzb21pc28yYXZjMW1wNDEAAAMxbW9vdgAAAGxtdmhkAAAAAAAAAAAAAAAAAAAD6AAAAfQAAQAAAQAA"
           "AAAAAAAAAAAAAAEAAAAAAAAAAAAAAAAAAAABAAAAAAAAAAAAAAAAAABAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAgAA"
           "Alx0cmFrAAAAXHRraGQAAAADAAAAAAAAAAAAAAABAAAAAAAAAfQAAAAAAAAAAAAAAAAAAAAAAAEAAAAAAAAAAAAAAAAAAAABAAAA"
           "AAAAAAAAAAAAAABAAAAAACAAAAAgAAAAAAAkZWR0cwAAABxlbHN0AAAAAAAAAAEAAAH0AAAAAAABAAAAAAHUbWRpYQAAACBtZGhk"
           "AAAAAAAAAAAAAAAAAABAAAAAIABVxAAAAAAALWhkbHIAAAAAAAAAAHZpZGUAAAAAAAAAAAAAAABWaWRlb0hhbmRsZXIAAAABf21p"
           "bmYAAAAUdm1oZAAAAAEAAAAAAAAAAAAAACRkaW5mAAAAHGRyZWYAAAAAAAAAAQAAAAx1cmwgAAAAAQAAAT9zdGJsAAAAv3N0c2QA"
           "AAAAAAAAAQAAAK9hdmMxAAAAAAAAAAEAAAAAAAAAAAAAAAAAAAAAACAAIABIAAAASAAAAAAAAAABFExhdmM2My4xLjEwMiBsaWJ4"
           "MjY0AAAAAAAAAAAAAAAAGP//AAAANWF2Y0MBZAAK/+EAGGdkAAqs2UlsBEAAAAMAQAAAAwIDxIllgAEABmjr48siwP34+AAAAAAQ"
           "cGFzcAAAAAEAAAABAAAAFGJ0cnQAAAAAAAAs8AAAAAAAAAAYc3R0cwAAAAAAAAABAAAAAgAAEAAAAAAUc3RzcwAAAAAAAAABAAAA"
           "AQAAABxzdHNjAAAAAAAAAAEAAAABAAAAAgAAAAEAAAAcc3RzegAAAAAAAAAAAAAAAgAAAsIAAAANAAAAFHN0Y28AAAAAAAAAAQAA"
           "A2EAAABhdWR0YQAAAFltZXRhAAAAAAAAACFoZGxyAAAAAAAAAABtZGlyYXBwbAAAAAAAAAAAAAAAACxpbHN0AAAAJKl0b28AAAAc"
           "ZGF0YQAAAAEAAAAATGF2ZjYzLjEuMTAyAAAACGZyZWUAAALXbWRhdAAAAp8GBf//m9xF6b3m2Ui3lizYINkj7u94MjY0IC0gY29y"
           "ZSAxNjUgLSBILjI2NC9NUEVHLTQgQVZDIGNvZGVjIC0gQ29weWxlZnQgMjAwMy0yMDI1IC0gaHR0cDovL3d3dy52aWRlb2xhbi5v"
           "cmcveDI2NC5odG1sIC0gb3B0aW9uczogY2FiYWM9MSByZWY9MyBkZWJsb2NrPTE6MDowIGFuYWx5c2U9MHgzOjB4MTEzIG1lPWhl"
           "eCBzdWJtZT03IHBzeT0xIHBzeV9yZD0xLjAwOjAuMDAgbWl4ZWRfcmVmPTEgbWVfcmFuZ2U9MTYgY2hyb21hX21lPTEgdHJlbGxp"
           "cz0xIDh4OGRjdD0xIGNxbT0wIGRlYWR6b25lPTIxLDExIGZhc3RfcHNraXA9MSBjaHJvbWFfcXBfb2Zmc2V0PS0yIHRocmVhZHM9"
           "MSBsb29rYWhlYWRfdGhyZWFkcz0xIHNsaWNlZF90aHJlYWRzPTAgbnI9MCBkZWNpbWF0ZT0xIGludGVybGFjZWQ9MCBibHVyYXlf"
           "Y29tcGF0PTAgY29uc3RyYWluZWRfaW50cmE9MCBiZnJhbWVzPTMgYl9weXJhbWlkPTIgYl9hZGFwdD0xIGJfYmlhcz0wIGRpcmVj"
           "dD0xIHdlaWdodGI9MSBvcGVuX2dvcD0wIHdlaWdodHA9MiBrZXlpbnQ9MjUwIGtleWludF9taW49NCBzY2VuZWN1dD00MCBpbnRy"
           "YV9yZWZyZXNoPTAgcmNfbG9va2FoZWFkPTQwIHJjPWNyZiBtYnRyZWU9MSBjcmY9MjMuMCBxY29tcD0wLjYwIHFwbWluPTAgcXBt"
           "YXg9NjkgcXBzdGVwPTQgaXBfcmF0aW89MS40MCBhcT0xOjEuMDAAgAAAABtliIQAEf/+5+P8CmsrEcS/TVAozem12z78G+EAAAAJ"
           "QZohbEEP/quA")

_MEDIA_JS = """() => {
  const cell = document.querySelector('[data-fidelity=media]');
  const img = cell.querySelector('.jp-OutputArea-output img'), video = cell.querySelector('video');
  const svg = document.querySelector('[data-fidelity=svgplot] .jp-OutputArea-output img, '
                                     + '[data-fidelity=svgplot] .jp-OutputArea-output svg');
  return {image: img ? [img.complete, img.naturalWidth > 100, img.src.split(':')[0]] : null,
          video: video ? [video.readyState >= 1, video.videoWidth, video.error && video.error.code,
                          video.src.split(':')[0]] : null,
          svg: svg ? [svg.tagName.toLowerCase(), (svg.naturalWidth || svg.getBoundingClientRect().width) > 100] : null};
}"""


def _media(nb: LabNotebook) -> dict:
    """Issue 32's fidelity: a matplotlib PNG in an Image widget, a real MP4 in a Video widget
    (both shown through blob: URLs) and an SVG plot as display_data, as with stock."""
    nb.run("import base64, io, ipywidgets as w, matplotlib.pyplot as plt\n"
           "fig = plt.figure(figsize=(2, 2)); plt.plot([1, 2]); buf = io.BytesIO(); fig.savefig(buf, format='png')\n"
           "plt.close(fig)\n"
           "display(w.Image(value=buf.getvalue(), format='png'))\n"
           f"display(w.Video(value=base64.b64decode('{MP4_B64}'), format='mp4', autoplay=False))", "media")
    nb.run("%config InlineBackend.figure_formats = ['svg']\nplt.plot([3, 1]); plt.show()\n"
           "%config InlineBackend.figure_formats = ['png']", "svgplot")
    nb.page.wait_for_function(f"() => {{ const m = ({_MEDIA_JS})(); return m.image && m.image[0] && m.svg"
                              " && m.video && (m.video[0] || m.video[2]); }", timeout=30_000, polling=250)
    nb.shot("media")
    return nb.page.evaluate(_MEDIA_JS)


def _slider(nb: LabNotebook) -> str:
    nb.run("import ipywidgets as widgets\ns = widgets.IntSlider(value=3, min=0, max=10)\ns", "slider")
    handle = "[data-fidelity=slider] .noUi-handle"
    nb.page.wait_for_selector(handle, timeout=30_000)
    nb.page.focus(handle)
    for _ in range(4):
        nb.page.keyboard.press("ArrowRight")
    t0 = time.monotonic()
    nb.shot("slider")
    values = []
    for i in range(10):  # how soon the kernel has the value the user sees
        values.append((round(time.monotonic() - t0, 2), nb.text(nb.run("print(s.value)", f"slider-value-{i}"))))
        if values[-1][1] == "7":
            break
        nb.page.wait_for_timeout(500)
    print("slider values", values)
    return values[-1][1]


def _input(nb: LabNotebook) -> str:
    nb.run("name = input('name? ')", "input", wait=False)
    box = "[data-fidelity=input] .jp-Stdin-input"
    nb.page.wait_for_selector(box, timeout=60_000)
    nb.page.fill(box, "Ada")
    nb.shot("input")
    nb.page.press(box, "Enter")
    nb.wait_idle()
    return nb.text(nb.run("print('hi', name)", "input-echo"))


def _stop(nb: LabNotebook) -> dict:
    nb.run("import time\ntime.sleep(120)", "stop", wait=False)
    nb.page.wait_for_function(panel_js("return p.sessionContext.session.kernel.status === 'busy';"), timeout=60_000)
    nb.page.wait_for_timeout(1500)
    nb.command("notebook:interrupt-kernel")
    nb.wait_idle(60)
    errors = [o.get("ename") for o in nb.outputs() if o.get("output_type") == "error"]
    nb.shot("stop")
    return {"error": errors, "x_after": nb.text(nb.run("print(x)", "stop-after"))}


def _script(nb: LabNotebook) -> dict:
    nb.run("from IPython.display import HTML\n"
           "HTML('<b id=fid>bold</b><img src=x onerror=\"window.__fidelity=1\"><script>window.__fidelity=2</script>')",
           "script")
    nb.page.wait_for_timeout(1500)
    ran = nb.page.evaluate("() => window.__fidelity || null")
    nb.shot("script")
    return {"ran": ran, "bold": nb.page.locator("[data-fidelity=script] b").count() > 0,
            "notice": "sandbox-kernel: removed" in nb.text()}


def _debugger(nb: LabNotebook) -> dict:
    button = ".jp-DebuggerBugButton"
    nb.page.wait_for_selector(button, timeout=30_000)
    enabled = nb.page.get_attribute(button, "aria-disabled") == "false"
    if not enabled:
        nb.shot("debugger-unavailable")
        return {"enabled": False}
    nb.page.click(button)
    nb.new_cell(DEBUG_CELL, "debug")
    nb.page.wait_for_selector("[data-fidelity=debug] .cm-breakpoint-gutter .cm-gutterElement >> nth=4", timeout=30_000)
    line2 = nb.page.locator("[data-fidelity=debug] .cm-lineNumbers .cm-gutterElement", has_text=re.compile(r"^2$"))
    box = line2.bounding_box()
    assert box is not None
    nb.page.mouse.click(box["x"] - 6, box["y"] + box["height"] / 2)  # the breakpoint gutter, left of the number
    nb.page.wait_for_timeout(500)
    nb.command("notebook:run-cell", wait=False)
    nb.page.wait_for_function("() => { const v = document.querySelector('.jp-DebuggerVariables');"
                              " return !!v && /\\ba\\b/.test(v.innerText) && /\\bb\\b/.test(v.innerText); }",
                              timeout=60_000)
    variables = nb.page.inner_text(".jp-DebuggerVariables")
    nb.shot("debugger-stopped")
    nb.command("debugger:continue", wait=False)
    nb.wait_idle(60)
    out = nb.text()
    nb.page.click(button)  # debugger off again
    nb.page.wait_for_timeout(500)
    flat = re.sub(r"[\s:]", "", variables)  # "a: 2" shown, "a\n2" in innerText
    return {"enabled": True, "locals": "a2" in flat and "b3" in flat, "out": out}


def _restart(nb: LabNotebook) -> dict:
    nb.page.evaluate(panel_js("window.__statuses = []; window.__stamps = []; "
                         "p.sessionContext.statusChanged.connect((_, s) => { window.__statuses.push(s); "
                         "window.__stamps.push(performance.now()); });"))
    t0 = nb.page.evaluate("() => performance.now()")
    log_before = nb.log_path.stat().st_size
    nb.command("notebook:restart-kernel", wait=False)
    nb.page.click(".jp-Dialog .jp-mod-accept", timeout=30_000)  # "Restart"
    nb.page.wait_for_function("() => (window.__statuses || []).includes('restarting') || "
                              "(window.__statuses || []).includes('starting')", timeout=60_000)
    nb.wait_idle()
    nb.page.wait_for_timeout(2000)
    shown = nb.page.inner_text(".jp-Toolbar-kernelStatus, .jp-KernelStatus") if nb.page.locator(
        ".jp-KernelStatus").count() else ""
    nb.shot("restart")
    with open(nb.log_path, "rb") as f:
        f.seek(log_before)
        server_log = f.read().decode(errors="replace")
    statuses = nb.page.evaluate("() => window.__statuses")
    stamps = nb.page.evaluate("() => window.__stamps")
    TIMES.setdefault(nb.kernel, {}).update(_restart_times(t0, statuses, stamps))
    after = nb.run("print('x' in dir())", "restart-after")
    print(f"{nb.kernel} restart: statuses {statuses}, toolbar {shown!r}")
    # What the status shows through the restart, each state once: JupyterLab itself passes
    # through "unknown" between the old and the new connection, for every kernel.
    seen_states = [st for i, st in enumerate(statuses) if st != "starting" and (i == 0 or statuses[i - 1] != st)]
    tracebacks = server_tracebacks(server_log)
    return {"states": seen_states[:3], "ends_idle": statuses[-1] == "idle",
            "traceback": tracebacks[0] if tracebacks else None, "fresh": nb.text(after)}


#: tornado's, when the server writes to a kernel's websocket the browser has just closed
#: (JupyterLab reconnects at every restart; jupyter_server never awaits its write): logged
#: as "Task exception was never retrieved", with the stock kernel as with the sandbox
#: (tornado#3359, jupyter/notebook#4649).  The server's noise, not the kernel's.
WEBSOCKET_CLOSED = "tornado.websocket.WebSocketClosedError"


def server_tracebacks(log: str) -> list[str]:
    """Each log record of the server's log (a line starting with ``[``, or asyncio's
    "... exception was never retrieved") holding a traceback, whole, except tornado's
    :data:`WEBSOCKET_CLOSED`."""
    records = re.split(r"\n(?=\[|Task exception was never retrieved|Future exception was never retrieved)", log)
    return [r for r in records if "Traceback" in r and r.rstrip().splitlines()[-1].strip() != WEBSOCKET_CLOSED]


def _restart_times(t0: float, statuses: list[str], stamps: list[float]) -> dict[str, float]:
    """From the restart's click: seconds to the first ``idle``, and seconds the status read
    ``unknown`` (reported beside stock's, never asserted: timing lives in bench/)."""
    idle = next((t for s, t in zip(statuses, stamps) if s == "idle"), stamps[-1] if stamps else t0)
    unknown = sum(stamps[i + 1] - t for i, (s, t) in enumerate(zip(statuses, stamps))
                  if s == "unknown" and i + 1 < len(stamps))
    return {"restart_to_idle_s": round((idle - t0) / 1000, 2), "unknown_s": round(unknown / 1000, 2)}


#: Seconds a user waits, per kernel (printed, and written to out/browser/lab-times.json).
TIMES: dict[str, dict[str, Any]] = {}

STEPS = (("first_tab", _first_tab), ("state", _state), ("table", _table), ("plot", _plot),
         ("media", _media), ("slider", _slider), ("input", _input), ("stop", _stop), ("script", _script),
         ("debugger", _debugger), ("restart", _restart))


@pytest.fixture(scope="module")
def stock_kernelspec(kernelspec_prefix) -> str:
    """The stock ipykernel as JupyterLab's own "Python 3 (ipykernel)" runs it, inside
    bubblewrap: the whole filesystem read-only (the checkout and its venv may live under
    any home), no host environment variables, a tmpfs for its home and temporary files,
    new user, PID, IPC and UTS namespaces (the network namespace is the host's:
    it must listen on the loopback ports of its connection file)."""
    import shutil
    import sys

    d = Path(kernelspec_prefix) / "share" / "jupyter" / "kernels" / STOCK
    d.mkdir(parents=True, exist_ok=True)
    scratch = "/var/tmp"
    argv = [shutil.which("bwrap") or "bwrap", "--die-with-parent", "--unshare-all", "--share-net",
            "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--tmpfs", scratch,
            "--clearenv", "--setenv", "PATH", "/usr/bin:/bin",
            "--setenv", "LANG", "C.UTF-8", "--setenv", "HOME", scratch, "--setenv", "TMPDIR", scratch,
            "--setenv", "IPYTHONDIR", f"{scratch}/.ipython", "--setenv", "MPLCONFIGDIR", f"{scratch}/mpl",
            sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"]
    (d / "kernel.json").write_text(json.dumps({
        "argv": argv, "display_name": "Python 3 (ipykernel)", "language": "python",
        "interrupt_mode": "message", "metadata": {"debugger": True}}))
    return STOCK


def _open_timed(browser, lab, kernel: str, which: str) -> LabNotebook:
    """Open a notebook with ``kernel`` picked, until the kernel is idle; the seconds go to
    TIMES (``open_to_idle_s``, ``second_open_to_idle_s``), with how a sandbox started."""
    nb = LabNotebook(browser, lab, kernel, which)
    t0 = time.monotonic()
    nb.open()
    what = "second_open" if which else "open"
    TIMES.setdefault(kernel, {})[f"{what}_to_idle_s"] = round(time.monotonic() - t0, 2)
    if kernel == SANDBOX:  # how its sandbox started: a spare, a start template, or cold
        sb = nb.page.evaluate(panel_js("return p.sessionContext.session.kernel.info.then(i => i.sandbox || {});"))
        TIMES[kernel][f"{what}_started_from"] = ("spare" if sb.get("pooled") else "template"
                                                 if sb.get("from_template") else "cold")
    return nb


@pytest.fixture(scope="module")
def seen(browser, lab, stock_kernelspec) -> dict[str, dict[str, Any]]:
    """Every step's observation, per kernel: the sandbox first, then stock."""
    out: dict[str, dict[str, Any]] = {}
    warm = browser.new_page()  # JupyterLab's own first load (its scripts) is not a kernel's start
    warm.goto(f"{lab[0]}/lab?token={lab[1]}")
    warm.wait_for_function("() => !!window.jupyterapp", timeout=120_000)
    warm.evaluate("() => window.jupyterapp.restored.then(() => true)")
    warm.close()
    for kernel in (SANDBOX, STOCK):
        nb = _open_timed(browser, lab, kernel, "")
        results: dict[str, Any] = {}
        try:
            for name, step in STEPS:
                try:
                    results[name] = step(nb)
                except Exception as err:  # one broken step must not hide the others' results
                    nb.shot(f"{name}-failed")
                    results[name] = f"step failed: {type(err).__name__}: {str(err)[:300]}"
            results["outside"] = nb.outside
        finally:
            nb.close()
        out[kernel] = results
        print(f"\n{kernel}: {json.dumps(results, default=str)[:3000]}")
        _open_timed(browser, lab, kernel, "-second").close()  # a second notebook: not its policy's first kernel
    print(f"\nwhat a user waits in JupyterLab (s): {json.dumps(TIMES)}")
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    (ARTIFACTS / "lab-times.json").write_text(json.dumps(TIMES, indent=1))
    return out


def test_the_first_tab_completes_within_jupyterlabs_timeout(seen):
    """The sandbox's first completion is served warm (C16).  The stock kernel's first one
    depends on jedi's cache on this machine (cold in a fresh CI run, and then dropped by
    JupyterLab too), so it is reported, not required."""
    first = seen[SANDBOX]["first_tab"]
    assert isinstance(first, dict) and first["completes"], (first, "stock:", seen[STOCK]["first_tab"])


def test_state_plot_input_and_stop_as_with_the_stock_kernel(seen):
    sandbox, stock = seen[SANDBOX], seen[STOCK]
    assert sandbox["state"] == stock["state"] == "42"
    assert sandbox["plot"] == stock["plot"] == {"image": [True, True, True]}
    assert sandbox["input"] == stock["input"] == "hi Ada"
    assert sandbox["stop"] == stock["stop"] == {"error": ["KeyboardInterrupt"], "x_after": "41"}


def test_a_dataframe_table_aligns_as_with_the_stock_kernel(seen):
    sandbox, stock = seen[SANDBOX]["table"], seen[STOCK]["table"]
    assert isinstance(sandbox, dict) and sandbox["cells"], sandbox
    assert sandbox == stock


def test_widget_media_and_svg_plots_show_as_with_the_stock_kernel(seen):
    """A PNG and an MP4 in widgets (blob: URLs the firewall judged by their bytes) and an SVG
    plot render in the sandbox exactly as with stock (issue 32: fidelity kept)."""
    sandbox, stock = seen[SANDBOX]["media"], seen[STOCK]["media"]
    assert isinstance(sandbox, dict) and sandbox["image"] == [True, True, "blob"], sandbox
    assert sandbox["video"][3] == "blob" and sandbox["svg"][1] is True, sandbox
    assert sandbox == stock


def test_a_slider_moved_with_the_keyboard_changes_the_python_value(seen):
    assert seen[SANDBOX]["slider"] == seen[STOCK]["slider"] == "7"


def test_the_debugger_stops_at_a_breakpoint_and_shows_the_locals(seen):
    expected = {"enabled": True, "locals": True, "out": "5"}
    assert seen[SANDBOX]["debugger"] == seen[STOCK]["debugger"] == expected


def test_restart_shows_what_the_stock_kernel_shows_and_logs_no_traceback(seen):
    """Restarting, then idle with a fresh interpreter: the states the stock kernel shows (the
    "unknown" JupyterLab passes through while reconnecting included, and no longer), no
    traceback in the server's log (the proxy answers kernel_info on control at once)."""
    expected = {"states": ["restarting", "unknown", "busy"], "ends_idle": True, "traceback": None,
                "fresh": "False"}
    assert seen[SANDBOX]["restart"] == seen[STOCK]["restart"] == expected


def test_script_output_is_the_one_difference(seen):
    assert seen[SANDBOX]["script"] == {"ran": None, "bold": True, "notice": True}
    assert seen[STOCK]["script"]["ran"] is not None  # the control: the payload is live unfiltered
    for kernel in (SANDBOX, STOCK):
        assert seen[kernel]["outside"] == []
