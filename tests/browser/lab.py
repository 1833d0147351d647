"""A notebook page in JupyterLab driven the way a user drives it (Playwright), shared by
the browser suites."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import nbformat
from playwright.sync_api import TimeoutError as PlaywrightTimeout

ARTIFACTS = Path(os.environ.get("SANDBOX_KERNEL_ARTIFACTS", Path(__file__).resolve().parents[2] / "out")) / "browser"

_PANEL = "const p = window.jupyterapp.shell.currentWidget;"


def panel_js(body: str, args: str = "") -> str:
    """A page function with ``p``, the current notebook panel, in scope."""
    return f"({args}) => {{ {_PANEL} {body} }}"


_KERNEL_IDLE = ("() => { if (!window.jupyterapp) return false; " + _PANEL + " const k = p && p.sessionContext "
                "&& p.sessionContext.session && p.sessionContext.session.kernel; return !!k && k.status === 'idle' "
                "&& k.connectionStatus === 'connected'; }")


class LabNotebook:
    """One notebook page in JupyterLab, driven the way a user drives it."""

    def __init__(self, context, lab, kernel_name: str, which: str = ""):
        """``which``: a suffix naming another notebook (and workspace) with the same kernel."""
        self.base, self.token, self.root, self.log_path = lab
        self.kernel = kernel_name
        self.workspace = f"fidelity-{kernel_name}{which}"
        self.shots = ARTIFACTS / f"{kernel_name}{which}"
        self.shots.mkdir(parents=True, exist_ok=True)
        self.step = 0
        self.name = f"{self.workspace}.ipynb"
        nb = nbformat.v4.new_notebook()
        nb.metadata["kernelspec"] = {"name": kernel_name, "display_name": kernel_name, "language": "python"}
        nb.cells = [nbformat.v4.new_code_cell("")]
        nbformat.write(nb, self.root / self.name)
        self.page = context.new_page()
        self.page.route("**/*", self._loopback_only)
        self.outside: list[str] = []

    def _loopback_only(self, route):
        host = route.request.url.split("/")[2].split("@")[-1].rsplit(":", 1)[0]
        if route.request.url.startswith(("data:", "blob:")) or host in ("127.0.0.1", "localhost"):
            route.continue_()
        else:
            self.outside.append(route.request.url)
            route.abort()

    def open(self) -> None:
        self.page.goto(f"{self.base}/lab/workspaces/{self.workspace}/tree/{self.name}?token={self.token}")
        self.wait_idle()

    def wait_idle(self, timeout_s: float = 180) -> None:
        self.page.wait_for_function(_KERNEL_IDLE, timeout=timeout_s * 1000, polling=200)

    def shot(self, what: str) -> None:
        self.step += 1
        self.page.screenshot(path=str(self.shots / f"{self.step:02d}-{what}.png"))

    def command(self, name: str, args: dict | None = None, wait: bool = True) -> Any:
        js = (f"() => window.jupyterapp.commands.execute({json.dumps(name)}, {json.dumps(args or {})})" if wait else
              f"() => {{ void window.jupyterapp.commands.execute({json.dumps(name)}, {json.dumps(args or {})}); }}")
        return self.page.evaluate(js)

    def new_cell(self, code: str, tag: str) -> None:
        """Append a cell holding ``code`` below the last one and make it the active cell;
        its node gets ``data-fidelity=tag`` for selectors."""
        self.page.evaluate(panel_js("""const nb = p.content; nb.activeCellIndex = nb.widgets.length - 1;
            if (nb.activeCell.model.sharedModel.getSource() !== '') {
              window.jupyterapp.commands.execute('notebook:insert-cell-below'); }
            nb.activeCell.model.sharedModel.setSource(code);
            nb.activeCell.node.setAttribute('data-fidelity', tag);""", "[code, tag]"), [code, tag])

    def run(self, code: str, tag: str, wait: bool = True, timeout_s: float = 120) -> list[dict]:
        """Type ``code`` into a new cell and run it (Shift+Enter's command, without moving on);
        with ``wait``, until the kernel is idle again; the cell's outputs (nbformat)."""
        self.new_cell(code, tag)
        self.command("notebook:run-cell", wait=False)
        if wait:
            try:
                self.page.wait_for_function(panel_js("""const c = p.content.activeCell;
                    return c.model.executionCount !== null && p.sessionContext.session.kernel.status === 'idle';"""),
                                            timeout=timeout_s * 1000, polling=200)
            except PlaywrightTimeout as err:
                raise AssertionError(f"cell {tag!r} did not finish in {timeout_s:.0f} s\n{self.diagnosis()}") from err
        return self.outputs()

    def diagnosis(self) -> str:
        """What a failed wait leaves to read: the kernel's status, the cell's outputs so
        far, a screenshot, and the end of the server's log (the kernels' own log lines)."""
        status = self.page.evaluate(panel_js("const k = p.sessionContext.session && "
                                             "p.sessionContext.session.kernel; return k ? k.status : 'no kernel';"))
        self.shot("failed-wait")
        log_tail = "".join(self.log_path.read_text(errors="replace").splitlines(keepends=True)[-80:])
        return f"kernel status: {status}\noutputs: {self.outputs()}\n--- lab log (end) ---\n{log_tail}"

    def outputs(self) -> list[dict]:
        return self.page.evaluate(panel_js("return p.content.activeCell.model.outputs.toJSON();"))

    def text(self, outputs: list[dict] | None = None) -> str:
        out = []
        for o in outputs if outputs is not None else self.outputs():
            if o.get("output_type") == "stream":
                out.append(o["text"] if isinstance(o["text"], str) else "".join(o["text"]))
            elif "data" in o:
                t = o["data"].get("text/plain", "")
                out.append(t if isinstance(t, str) else "".join(t))
        return "".join(out).strip()

    def close(self) -> None:
        self.page.close()


