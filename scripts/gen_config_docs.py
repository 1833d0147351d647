"""Regenerate the option table in docs/configuration.md from SandboxKernel's traits.

Usage: .venv/bin/python scripts/gen_config_docs.py
"""

from pathlib import Path

from sandbox_kernel.proxy import SandboxKernel

BEGIN, END = "<!-- options:begin -->", "<!-- options:end -->"


def table() -> str:
    rows = ["| option | type | meaning, unit and default |", "| --- | --- | --- |"]
    for name, t in sorted(SandboxKernel.class_traits(config=True).items()):
        if t.this_class is SandboxKernel:
            rows.append(f"| `{name}` | {type(t).__name__} | {t.help} |")
    return "\n".join(rows)


def main() -> None:
    doc = Path(__file__).resolve().parent.parent / "docs" / "configuration.md"
    text = doc.read_text()
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    doc.write_text(f"{head}{BEGIN}\n{table()}\n{END}{tail}")


if __name__ == "__main__":
    main()
