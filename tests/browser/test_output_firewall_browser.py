"""The output firewall in a real browser: JupyterLab in headless Chromium, driven by Playwright.

The test starts a loopback beacon (an HTTP server counting the paths asked of
it) and JupyterLab on loopback with a token, writes one notebook holding every
payload of ``tests/security/payloads.py`` (script payloads set
``window.__sk_<id>``, fetch payloads ask the beacon for ``/<id>``), and runs it
in the sandbox kernel (bubblewrap) three times over, as a user would see it:
live (display and execute results, display updates, page payloads, widget
creation and updates, ``Output`` widgets), after a page reload with the kernel
alive (widgets come back through ``update_states``), and after the saved
notebook is reopened with a new kernel (saved outputs and saved widget state).

Under ``output_policy=sanitize`` nothing may run and nothing may be fetched.
The same notebook under ``output_policy=trust`` (still in the sandbox: cell
code never runs outside one) is the control showing that the payloads do run
and fetch when nothing filters them, so this test can fail.  Chromium may
reach loopback only; any other request is aborted and fails the test.
"""

from __future__ import annotations

import http.server
import json
import shutil
import threading
import time
import urllib.request

import nbformat
import pytest
from kernels import kernel_name_for
from security.payloads import notebook_cells

from .page_escapes import (
    delete_terminals,
    media_cells,
    open_media_in_new_tabs,
    restyled_outside_outputs,
    style_cell,
    terminals,
)

#: After a notebook is idle, how long renderers that load lazily (Vega, MathJax) get to act.
SETTLE_S = 6.0
#: The open-in-new-tab phase sees whether a payload could create a terminal (the control does).
LAB_TERMINALS = True


class Beacon:
    """A loopback HTTP server recording every path asked of it."""

    def __init__(self):
        hits = self.hits = []

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                hits.append(self.path.lstrip("/").split("?")[0])
                body = b"GIF89a\x01\x00\x01\x00\x00\x00\x00;"
                self.send_response(200)
                self.send_header("Content-Type", "image/gif")
                self.send_header("Access-Control-Allow-Origin", "*")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_POST = do_GET

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.address = f"127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(scope="module")
def beacon():
    b = Beacon()
    yield b
    b.close()


@pytest.fixture(scope="module")
def firewall_specs(install_kernelspec):
    for policy in ("sanitize", "trust"):
        install_kernelspec("bubblewrap", f"browser-{policy}", output_policy=policy)


_STATE_JS = """() => {
  const marks = Object.keys(window).filter(k => k.startsWith('__sk_')).map(k => k.slice(5));
  for (const f of document.querySelectorAll('iframe')) {
    try { marks.push(...Object.keys(f.contentWindow).filter(k => k.startsWith('__sk_')).map(k => k.slice(5))); }
    catch (e) {}
  }
  return marks;
}"""

_KERNEL_IDLE_JS = """() => {
  const app = window.jupyterapp; const panel = app && app.shell.currentWidget;
  const kernel = panel && panel.sessionContext && panel.sessionContext.session && panel.sessionContext.session.kernel;
  return !!kernel && kernel.status === 'idle' && kernel.connectionStatus === 'connected';
}"""

_READY_JS = """() => {
  const app = window.jupyterapp; if (!app) return false;
  const panel = app.shell.currentWidget;
  if (!panel || !panel.sessionContext || !panel.content) return false;
  const kernel = panel.sessionContext.session && panel.sessionContext.session.kernel;
  if (!kernel || kernel.status !== 'idle' || kernel.connectionStatus !== 'connected') return false;
  return panel.content.widgets.filter(c => c.model.type === 'code')
    .every(c => c.model.executionCount !== null);
}"""


class Run:
    """One notebook in one page, phase by phase."""

    def __init__(self, context, lab, beacon, policy):
        self.base, self.token, self.root, _ = lab
        self.beacon = beacon
        self.policy = policy
        self.name = f"corpus-{policy}.ipynb"
        self.outside: list[str] = []
        nb = nbformat.v4.new_notebook()
        nb.metadata["kernelspec"] = {"name": kernel_name_for("bubblewrap", f"browser-{policy}"),
                                     "display_name": f"sandbox {policy}", "language": "python"}
        nb.cells = [nbformat.v4.new_code_cell(c) for c in notebook_cells(beacon.address) + media_cells(beacon.address)
                    + [style_cell()]]
        nbformat.write(nb, self.root / self.name)
        self.page = context.new_page()
        self.page.route("**/*", self._guard)
        self.results: dict[str, tuple[list[str], list[str]]] = {}
        #: phase -> (sources opened in new tabs, those whose tab ran script, the tabs' content types)
        self.tabs: dict[str, tuple[list[str], list[str], list[str]]] = {}
        #: phase -> elements outside every output that the style cell reached
        self.restyled: dict[str, list[str]] = {}

    def _guard(self, route):
        host = route.request.url.split("/")[2].split("@")[-1].rsplit(":", 1)[0]
        if route.request.url.startswith(("data:", "blob:")) or host in ("127.0.0.1", "localhost", "[::1]"):
            route.continue_()
        else:
            self.outside.append(route.request.url)
            route.abort()

    def _open(self):
        self.page.goto(f"{self.base}/lab/workspaces/{self.policy}/tree/{self.name}?token={self.token}")
        self._wait_kernel()

    def _wait_kernel(self):
        """Until the notebook's kernel is connected and idle (cells run before that are lost)."""
        self.page.wait_for_function(_KERNEL_IDLE_JS, timeout=180_000, polling=250)

    def _settle(self, phase: str, start: int, ready_js: str = _READY_JS):
        self.page.wait_for_function(ready_js, timeout=240_000, polling=250)
        self.page.wait_for_timeout(SETTLE_S * 1000)
        self.results[phase] = (sorted(self.page.evaluate(_STATE_JS)), self.beacon.hits[start:])
        self.restyled[phase] = restyled_outside_outputs(self.page)
        if phase in ("live", "reload"):  # "Open image in new tab" on every media element
            self.tabs[phase] = open_media_in_new_tabs(self.page, self._guard, 1000)

    def run(self):
        start = len(self.beacon.hits)
        self._open()
        self.page.evaluate("() => { void window.jupyterapp.commands.execute('notebook:run-all-cells'); }")
        self._settle("live", start)
        self.page.evaluate("() => window.jupyterapp.commands.execute('docmanager:save')")  # resolves when saved
        self.page.wait_for_timeout(1000)
        # A page reload with the kernel alive: outputs from the saved file, widgets from the kernel.
        start = len(self.beacon.hits)
        self.page.reload()
        self._wait_kernel()
        self._settle("reload", start, _READY_JS.replace(".every(c => c.model.executionCount !== null)",
                                                        ".length > 0"))
        # The saved notebook reopened with a new kernel: saved outputs and saved widget state.
        sessions = json.loads(urllib.request.urlopen(f"{self.base}/api/sessions?token={self.token}").read())
        for s in sessions:
            req = urllib.request.Request(f"{self.base}/api/sessions/{s['id']}?token={self.token}", method="DELETE")
            urllib.request.urlopen(req).read()
        start = len(self.beacon.hits)
        self.page.goto("about:blank")
        self._open()
        self._settle("reopen", start, _READY_JS.replace(".every(c => c.model.executionCount !== null)",
                                                        ".length > 0"))
        self.page.close()
        return self.results, self.tabs, self.restyled


@pytest.fixture(scope="module")
def runs(browser, lab, beacon, firewall_specs):
    out = {}
    for policy in ("sanitize", "trust"):
        t0 = time.monotonic()
        before, hits_at = set(terminals(lab[0], lab[1])), len(beacon.hits)
        r = Run(browser, lab, beacon, policy)
        results, tabs, restyled = r.run()
        made = sorted(set(terminals(lab[0], lab[1])) - before)
        delete_terminals(lab[0], lab[1], made)
        tab_fetches = [h for h in beacon.hits[hits_at:] if h.startswith("nt-")]
        out[policy] = (results, r.outside, time.monotonic() - t0, tabs, made, tab_fetches, restyled)
        print(f"\n{policy} restyled outside outputs: " + "; ".join(f"{ph}: {len(e)} {e[:6]}" for ph, e in restyled.items()))
        print(f"\n{policy} new tabs: " + "; ".join(f"{ph}: {len(s)} opened, ran in {r_} ({sorted(set(t))})"
                                                   for ph, (s, r_, t) in tabs.items()) + f"; fetches {tab_fetches}; terminals made {made}")
        print(f"\n{policy}: " + "; ".join(f"{ph}: {len(e)} executions {e}, {len(f)} fetches {sorted(set(f))}"
                                          for ph, (e, f) in out[policy][0].items())
              + f" ({out[policy][2]:.0f} s)")
    shutil.rmtree(lab[2] / ".ipynb_checkpoints", ignore_errors=True)
    return out


@pytest.mark.parametrize("phase", ["live", "reload", "reopen"])
def test_sanitize_runs_nothing_and_fetches_nothing(runs, phase):
    results, outside, *_ = runs["sanitize"]
    executions, fetches = results[phase]
    assert executions == [] and fetches == [], f"{phase}: ran {executions}, fetched {fetches}"
    assert outside == []


@pytest.mark.parametrize("phase", ["live", "reload", "reopen"])
def test_trust_control_shows_the_payloads_work(runs, phase):
    results, outside, *_ = runs["trust"]
    executions, fetches = results[phase]
    assert executions, f"{phase}: no payload ran without the firewall: the test could not fail"
    if phase == "live":
        assert fetches, "no payload fetched without the firewall: the test could not fail"
        assert {"w2", "w1", "h2", "js1"} <= set(executions)
        assert {"fmd2", "fvl1"} <= set(fetches)
    assert outside == []


@pytest.mark.parametrize("phase", ["live", "reload"])
def test_sanitize_media_opened_in_new_tab_run_nothing(runs, phase):
    """Issue 32: every img/video/audio source opened as "Open image in new tab" does."""
    _, _, _, tabs, made, tab_fetches, _ = runs["sanitize"]
    sources, ran, types = tabs[phase]
    assert ran == [], f"{phase}: script ran in new tabs of {ran}"
    assert tab_fetches == []
    assert made == [], f"a payload created the terminals {made}"
    assert any(s.startswith("blob:") for s in sources), "no widget image was shown: the phase saw nothing"
    assert "blob image/png" in types, "the real PNG widget did not open as an image in a new tab"
    assert [t for t in types if t.startswith("blob") and t != "blob image/png"] == [], types


@pytest.mark.parametrize("phase", ["live", "reload"])
def test_trust_control_media_tabs_run_script(runs, phase):
    _, _, _, tabs, made, tab_fetches, _ = runs["trust"]
    sources, ran, types = tabs[phase]
    assert ran, f"{phase}: no SVG opened in a new tab ran script without the firewall: the test could not fail"
    # Only that the script ran (window.__sk_nt) is asserted: headless Chromium ran it in the
    # blob: tab, but neither its fetch to the beacon nor its POST to /api/terminals was seen
    # (cause not established); the sanitize tests assert all three are absent anyway.
    print(f"trust {phase}: tab fetches {tab_fetches}, terminals made {made}")


@pytest.mark.parametrize("phase", ["live", "reload", "reopen"])
def test_sanitize_styles_stay_in_their_output(runs, phase):
    """Issue 32: no rule of an output's <style> reaches the page, another output or a notice."""
    restyled = runs["sanitize"][6][phase]
    assert restyled == [], f"{phase}: the style cell restyled {restyled}"


def test_trust_control_styles_reach_the_page(runs):
    restyled = runs["trust"][6]["live"]
    assert restyled, "without the firewall the style cell restyled nothing: the test could not fail"
