"""Regenerate the option tables in docs/configuration.md from the one definition of each option.

The policy options come from ``Policy``'s field metadata (``sandbox_kernel.policy.OPTIONS``),
the kernel's own from ``KernelOptions``' traits, each backend's from its class's traits
(every backend of the ``sandbox_kernel.backends`` group is imported: run it in the
dev venv, which has every extra).  ``tests/test_kernel_basics.py`` checks that the
file holds what this prints.

Usage: .venv/bin/python scripts/gen_config_docs.py
"""

from pathlib import Path

from sandbox_kernel.backends import available_backends, load_backend
from sandbox_kernel.options import DEPRECATED_ALIASES, KernelOptions, kernel_trait_names
from sandbox_kernel.policy import OPTIONS

BEGIN, END = "<!-- options:begin -->", "<!-- options:end -->"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def policy_table() -> str:
    """One row per policy option: flag, unit, default, who enforces it, meaning."""
    backends = {name: load_backend(name) for name in available_backends()}
    rows = ["| option (`SandboxKernel.`) | flag | unit | default | enforced by | meaning |",
            "| --- | --- | --- | --- | --- | --- |"]
    for o in OPTIONS:
        if o.scope == "proxy":
            who = "the proxy (every backend)"
        else:
            who = ", ".join(n for n, cls in backends.items() if o.name in cls.enforced_fields) or "no backend"
        flag = f"`{o.flag}`" + (f", `{o.meta.alias}`" if o.meta.alias else "")
        rows.append(f"| `{o.name}` | {flag} | {o.meta.unit or '-'} | {_cell(o.default_text())} | "
                    f"{who} | {_cell(o.meta.help)} |")
    return "\n".join(rows)


def trait_table(traits: dict, section: str) -> str:
    """One row per trait: name, type, help (which carries unit and default)."""
    rows = [f"| option (`{section}.`) | type | meaning, unit and default |", "| --- | --- | --- |"]
    for name, t in sorted(traits.items()):
        rows.append(f"| `{name}` | {type(t).__name__} | {_cell(t.help)} |")
    return "\n".join(rows)


def table() -> str:
    """Everything between the markers in docs/configuration.md."""
    policy = {o.name for o in OPTIONS}
    own = {n: t for n, t in KernelOptions.class_traits(config=True).items()
           if n in kernel_trait_names() or n == "backend"}
    parts = ["### Policy", "", policy_table(), "",
             "### Kernel", "", trait_table({n: t for n, t in own.items() if n not in policy}, "SandboxKernel")]
    for name in available_backends():
        cls = load_backend(name)
        parts += ["", f"### Backend `{name}`: `{cls.__name__}`", "",
                  trait_table(cls.class_traits(config=True), cls.__name__)]
    old = ["| old spelling | now |", "| --- | --- |",
           *(f"| `SandboxKernel.{k}` | `{v}` |" for k, v in DEPRECATED_ALIASES.items()),
           "| `SandboxKernel.backend_options={...}` | one `<BackendClass>.<name>` per key |"]
    parts += ["", "### Deprecated spellings", "", "Still accepted, with a warning in the kernel's log:", "",
              "\n".join(old)]
    return "\n".join(parts)


def main() -> None:
    doc = Path(__file__).resolve().parent.parent / "docs" / "configuration.md"
    text = doc.read_text()
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    doc.write_text(f"{head}{BEGIN}\n{table()}\n{END}{tail}")


if __name__ == "__main__":
    main()
