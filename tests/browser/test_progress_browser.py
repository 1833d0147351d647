"""JupyterLab shows what a cell waits for while its sandbox comes back (issue 18, item 8).

A gVisor kernel whose sandbox is stopped after 2 idle seconds: the next cell starts a
fresh sandbox (a cold start, ~2.5 s here).  While it waits, the cell's output area shows
``sandbox-kernel: starting the sandbox… N s``, counting; once the cell runs, that line
is gone from the page and from the saved outputs, and the cell shows the state-lost
notice and its own output.  Screenshots in ``out/browser/<kernel>/``.
"""

from __future__ import annotations

from .lab import LabNotebook, panel_js

_SANDBOX_STATE = panel_js("""return p.sessionContext.session.kernel.requestKernelInfo()
    .then(r => r.content.sandbox.state);""")


def test_a_cell_waiting_for_its_sandbox_shows_it_then_only_its_output(browser, lab, install_kernelspec):
    # the cold path, said so: no spare sandbox to wake into, no start template to restore
    name = install_kernelspec("gvisor", "progress", pause_after_s=0, checkpoint_after_s=0, stop_after_s=2,
                              spare_sandbox=False, start_template=False)
    nb = LabNotebook(browser, lab, name)
    try:
        nb.open()
        assert nb.text(nb.run("x = 41", "first")) == ""
        deadline = nb.page.evaluate("() => Date.now()") + 120_000
        while nb.page.evaluate(_SANDBOX_STATE) != "stopped":  # never wakes the sandbox
            assert nb.page.evaluate("() => Date.now()") < deadline, "the idle sandbox was not stopped"
            nb.page.wait_for_timeout(300)
        nb.run("print('x' in dir())", "woken", wait=False)
        waiting = nb.page.wait_for_selector("[data-fidelity=woken] .jp-OutputArea-output >> "
                                            "text=/sandbox-kernel: starting the sandbox… \\d+ s/",
                                            timeout=30_000)
        seen = waiting.inner_text()
        nb.shot("waiting-for-the-sandbox")
        nb.wait_idle()
        nb.page.wait_for_function(panel_js("return p.content.activeCell.model.executionCount !== null;"),
                                  timeout=60_000)
        nb.shot("woken-cell-ran")
        shown = nb.page.inner_text("[data-fidelity=woken] .jp-Cell-outputArea")
        outputs = nb.outputs()
        assert seen.startswith("sandbox-kernel: starting the sandbox… ")
        assert "sandbox-kernel: starting" not in shown and "sandbox-kernel: starting" not in nb.text(outputs)
        assert "state was lost" in shown or "were lost" in shown, shown
        assert "False" in nb.text(outputs)  # a fresh interpreter, said so above it
        assert [o["output_type"] for o in outputs] == ["stream", "stream"], outputs  # notice, output
    finally:
        nb.close()
