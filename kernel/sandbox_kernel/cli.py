"""``sandbox-kernel``: install, list, doctor, gc, run.

Examples
--------
::

    sandbox-kernel install --sys-prefix                 # "Python 3 (sandbox: local)"
    sandbox-kernel install --name sandbox-small --memory-mib 1024 --cell-timeout-s 60
    sandbox-kernel doctor                               # which runtimes work here
    sandbox-kernel run notebooks/quickstart.ipynb       # executes through the sandbox
    sandbox-kernel gc                                   # reap orphaned sandboxes
    sandbox-kernel pool --size 4 --runtime gvisor       # warm pool for fast starts (root)
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

#: Policy options accepted by ``install`` and ``pool`` (flag -> SandboxKernel trait / Policy field).
POLICY_FLAGS = {
    "runtime": str, "memory_mib": int, "cpu_cores": float, "pids_max": int, "scratch_mib": int,
    "cell_timeout_s": float, "lifetime_s": float, "pause_after_s": float,
    "checkpoint_after_s": float, "stop_after_s": float, "output_policy": str, "python": str,
}


def add_policy_flags(parser: argparse.ArgumentParser, help_format: str) -> None:
    """Add one ``--memory-mib``-style flag per :data:`POLICY_FLAGS` entry (default: unset);
    ``help_format`` is formatted with ``name``."""
    for flag, typ in POLICY_FLAGS.items():
        parser.add_argument(f"--{flag.replace('_', '-')}", dest=flag, type=typ, default=None,
                            help=help_format.format(name=flag))


def policy_options(args: argparse.Namespace) -> dict:
    """The policy flags given on the command line: field name -> value (unset ones left out)."""
    return {k: getattr(args, k) for k in POLICY_FLAGS if getattr(args, k, None) is not None}


def _cmd_install(args: argparse.Namespace) -> int:
    from .kernelspec import install

    options = policy_options(args)
    name = args.name or f"sandbox-{args.backend}"
    dest = install(name, backend=args.backend, options=options, display_name=args.display_name,
                   user=args.user, prefix=args.prefix, sys_prefix=args.sys_prefix)
    print(f"Installed kernelspec {name} in {dest}")
    if args.backend == "local":
        _build_jedi_cache(options.get("python") or sys.executable)
    return 0


def _build_jedi_cache(python: str) -> None:
    """Build the jedi cache local sandboxes start with (C16; otherwise the first kernel does)."""
    from .backends.local import jedi_cache

    current = jedi_cache.seed(python, build_missing=False)
    if current is not None and jedi_cache.stale_entries(Path(current)) == 0:
        print(f"Completion cache for {python}: {current} (up to date)")
        return
    print(f"Building the completion cache for {python} (jedi, standard library; ~15 s)...")
    built = jedi_cache.build(python)
    print(f"  {built}" if built else "  not built now (see the log); the first kernel builds it")


def _cmd_list(args: argparse.Namespace) -> int:
    from jupyter_client.kernelspec import KernelSpecManager

    specs = KernelSpecManager().get_all_specs()
    rows = [(n, s["spec"]["display_name"], s["resource_dir"]) for n, s in sorted(specs.items())
            if s["spec"].get("metadata", {}).get("sandbox_kernel") is not None]
    if not rows:
        print("No sandbox-kernel kernelspecs. Run: sandbox-kernel install --sys-prefix")
        return 1
    for n, d, r in rows:
        print(f"{n:24} {d:32} {r}")
    return 0


def _cmd_doctor(args: argparse.Namespace) -> int:
    from .doctor import run_doctor

    return run_doctor(as_json=args.json)


def _cmd_gc(args: argparse.Namespace) -> int:
    from .backends.local.reaper import collect

    reaped = collect(dry_run=args.dry_run, print_fn=print)
    print(f"{'would reap' if args.dry_run else 'reaped'} {reaped} orphaned sandbox(es)")
    return 0


def _cmd_pool(args: argparse.Namespace) -> int:
    from .backends.local.pool.daemon import main as pool_main
    from .policy import Policy

    return pool_main(Policy(**policy_options(args)), args.size, args.socket, status=args.status)


def _cmd_run(args: argparse.Namespace) -> int:
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError

    src = Path(args.notebook)
    out = Path(args.output) if args.output else Path("out") / src.name
    nb = nbformat.read(src, as_version=4)
    client = NotebookClient(nb, kernel_name=args.kernel, timeout=args.timeout,
                            allow_errors=args.allow_errors, resources={"metadata": {"path": args.cwd or "."}})
    t0 = time.monotonic()
    status = 0
    try:
        client.execute()
    except CellExecutionError as err:
        print(f"error: {err.ename}: {err.evalue} (use --allow-errors to continue past errors)",
              file=sys.stderr)
        status = 1
    out.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, out)
    code = [c for c in nb.cells if c.cell_type == "code"]
    n_out = sum(len(c.get("outputs", [])) for c in code)
    n_err = sum(1 for c in code for o in c.get("outputs", []) if o.get("output_type") == "error")
    not_run = sum(1 for c in code if c.get("execution_count") is None and c.source.strip())
    stopped = f", stopped early: {not_run} cells not run" if status and not_run else ""
    print(f"{src}: {len(code)} code cells, {n_out} outputs, {n_err} errors{stopped}, "
          f"{time.monotonic() - t0:.1f} s on kernel {args.kernel} -> {out}")
    return status


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="sandbox-kernel", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("install", help="write a kernelspec (like python -m ipykernel install)")
    p.add_argument("--name", help="kernelspec name (default: sandbox-<backend>)")
    p.add_argument("--display-name", help="name shown in JupyterLab")
    p.add_argument("--backend", default="local", help="local (default), e2b or modal")
    where = p.add_mutually_exclusive_group()
    where.add_argument("--user", action="store_true", help="install for the current user")
    where.add_argument("--sys-prefix", action="store_true", help="install into sys.prefix (the venv)")
    where.add_argument("--prefix", help="install into this prefix")
    add_policy_flags(p, "policy: SandboxKernel.{name}")
    p.set_defaults(func=_cmd_install)

    p = sub.add_parser("list", help="list installed sandbox kernelspecs")
    p.set_defaults(func=_cmd_list)

    p = sub.add_parser("doctor", help="which runtimes and backends work here, and what is missing")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=_cmd_doctor)

    p = sub.add_parser("gc", help="find and remove orphaned sandboxes")
    p.add_argument("--dry-run", action="store_true", help="only list them")
    p.set_defaults(func=_cmd_gc)

    p = sub.add_parser("pool", help="keep N sandboxes started for fast kernel starts (local backend)")
    p.add_argument("--size", type=int, default=2, help="sandboxes kept ready (default: 2)")
    p.add_argument("--socket", help="unix socket to listen on (default: <state dir>/pool.sock, "
                   "which kernels use unless SandboxKernel.pool_socket says otherwise)")
    p.add_argument("--status", action="store_true", help="ask a running pool for its state and exit")
    add_policy_flags(p, "policy: must equal the kernels' SandboxKernel.{name}")
    p.set_defaults(func=_cmd_pool)

    p = sub.add_parser("run", help="execute a notebook through a sandboxed kernel (nbclient)")
    p.add_argument("notebook")
    p.add_argument("--kernel", default="sandbox-local", help="kernelspec name (default: sandbox-local)")
    p.add_argument("--output", "-o", help="where to write the executed notebook (default: out/<name>)")
    p.add_argument("--timeout", type=int, default=300, help="seconds per cell (default: 300)")
    p.add_argument("--allow-errors", action="store_true", help="keep going after a cell error")
    p.add_argument("--cwd", help="host working directory for the kernel process (default: .)")
    p.set_defaults(func=_cmd_run)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
