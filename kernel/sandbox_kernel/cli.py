"""``sandbox-kernel``: install, list, doctor, gc, pool, service, run, mcp.

Examples
--------
::

    sandbox-kernel install --sys-prefix                 # "Python 3 (sandbox: local)"
    sandbox-kernel install --name sandbox-small --memory-mib 1024 --cell-timeout-s 60
    sandbox-kernel install --backend e2b --template my-template --deadman-s 120
    sandbox-kernel doctor                               # which runtimes work here
    sandbox-kernel run notebooks/quickstart.ipynb       # executes through the sandbox
    sandbox-kernel gc                                   # reap orphaned sandboxes
    sandbox-kernel pool --size 4 --runtime gvisor       # warm pool for fast starts (root)
    sandbox-kernel service                              # sandbox service for ordinary users (root)
    sandbox-kernel mcp --kernel-name sandbox-local      # MCP server on stdio (for agents)
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path


def _install_flags(p: argparse.ArgumentParser, backend: str) -> list[str]:
    """``install``'s option flags: every policy option, the kernel's own, and the backend's
    (when it can be imported here); return their names."""
    from .options import (
        KernelOptions,
        add_trait_flags,
        backend_class_name,
        backend_traits,
        kernel_trait_names,
        policy_traits,
    )

    policy = policy_traits()
    kernel = {n: t for n, t in KernelOptions.class_traits(config=True).items()
              if n in kernel_trait_names() and n not in policy}
    add_trait_flags(p.add_argument_group("policy (SandboxKernel options)"), policy)
    add_trait_flags(p.add_argument_group("kernel (SandboxKernel options)"), kernel)
    traits = backend_traits(backend) or {}
    try:
        title = f"backend {backend} ({backend_class_name(backend)} options)"
    except Exception:  # noqa: BLE001  an unknown backend: `install` says so when it runs
        title = f"backend {backend}"
    missing = f"(the {backend} backend cannot be imported here: its options are not listed)"
    group = p.add_argument_group(title, None if traits else missing)
    add_trait_flags(group, {n: t for n, t in traits.items() if n not in policy and n not in kernel})
    return [*policy, *kernel, *traits]


def _pool_flags(p: argparse.ArgumentParser) -> list[str]:
    """``pool``'s option flags: every policy option and the local backend's sandbox options."""
    from .backends.local import LocalBackend
    from .options import add_trait_flags, policy_traits

    policy = policy_traits()
    add_trait_flags(p.add_argument_group("policy: must equal the kernels' SandboxKernel options"), policy)
    local = {n: LocalBackend.class_traits()[n] for n in LocalBackend.SANDBOX_OPTIONS}
    add_trait_flags(p.add_argument_group("local backend: must equal the kernels' LocalBackend options"),
                    local)
    return [*policy, *local]


def _service_flags(p: argparse.ArgumentParser) -> None:
    """``service``'s own bounds: images kept per user, and admission (the local backend's
    headroom options, for the service's sandboxes)."""
    from .backends.local import LocalBackend
    from .backends.local.service.copies import MAX_IMAGES_PER_UID
    from .options import add_trait_flags

    p.add_argument("--max-images-per-uid", type=int, default=MAX_IMAGES_PER_UID, metavar="N",
                   help="snapshots and fork hand-offs the service keeps for one user at once; one more is "
                   f"refused, naming this bound (default: {MAX_IMAGES_PER_UID})")
    add_trait_flags(p.add_argument_group("admission: what the machine keeps free of the service's sandboxes (as "
                                         "the LocalBackend options of the same names)"),
                    {n: LocalBackend.class_traits()[n] for n in LocalBackend.ADMISSION_OPTIONS})


def policy_options(args: argparse.Namespace) -> dict:
    """The policy flags given on the command line: field name -> value as the
    :class:`~sandbox_kernel.policy.Policy` field holds it (unset ones left out)."""
    from .options import flag_values, policy_value
    from .policy import OPTIONS

    given = flag_values(args, [o.name for o in OPTIONS])
    return {o.name: policy_value(o, given[o.name]) for o in OPTIONS if o.name in given}


def _cmd_install(args: argparse.Namespace) -> int:
    from .errors import ConfigError
    from .kernelspec import install
    from .options import flag_values
    from .policy import Policy

    options = flag_values(args, args.option_names)
    name = args.name or f"sandbox-{args.backend}"
    try:
        policy = Policy(**policy_options(args))  # refuse a bad policy now, not at the kernel's start
        if policy.workspace != "none" and os.path.isdir(policy.workspace_path or "\0"):
            from .workspace import resolve

            resolve(policy, "/")  # a folder that exists here is checked here too
        user, sys_prefix = install_location(args.user, args.sys_prefix, args.prefix)
        dest = install(name, backend=args.backend, options=options, display_name=args.display_name,
                       user=user, prefix=args.prefix, sys_prefix=sys_prefix, prestart=args.prestart)
    except ConfigError as err:
        print(f"sandbox-kernel install: {err}", file=sys.stderr)
        return 2
    print(f"Installed kernelspec {name} in {dest}")
    _build_agent_archive()
    if args.backend == "local":
        _build_jedi_cache(options.get("python") or sys.executable)
    return 0


def install_location(user: bool, sys_prefix: bool, prefix: str | None) -> tuple[bool, bool]:
    """``(user, sys_prefix)`` for ``sandbox-kernel install``: as given when one of the three
    is, else where this environment's Jupyter looks first: in a venv, the venv (its own
    kernelspecs shadow a system-wide one of the same name, and ``scripts/setup.sh`` writes
    ``sandbox-local`` there); outside one, the user's own as an ordinary user (the system's
    folder is not theirs to write), the system's as root."""
    if user or sys_prefix or prefix:
        return user, sys_prefix
    in_venv = sys.prefix != sys.base_prefix
    return (not in_venv and os.geteuid() != 0), in_venv


def _build_agent_archive() -> None:
    """Build the sandbox side's zipapp for this version now, not at a kernel's start."""
    from .guest import agent_archive

    try:
        print(f"Sandbox side: {agent_archive()}")
    except OSError as err:  # the first kernel builds it (and says why it cannot)
        print(f"Sandbox side: not built now ({err}); the first kernel builds it")


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

    return run_doctor(as_json=args.json, service_socket=args.service_socket)


def _cmd_gc(args: argparse.Namespace) -> int:
    from .backends.local.reaper import collect

    reaped = collect(dry_run=args.dry_run, print_fn=print)
    print(f"{'would reap' if args.dry_run else 'reaped'} {reaped} orphaned sandbox(es)")
    from .backends.local.snapshots import collect as collect_snapshots

    print(f"{'would remove' if args.dry_run else 'removed'} the snapshots of "
          f"{collect_snapshots(args.dry_run)} ended kernel(s)")
    if os.geteuid() == 0:  # the images the sandbox service keeps for users' kernels (root's)
        from .backends.local.service.copies import collect as collect_service

        print(f"{'would remove' if args.dry_run else 'removed'} the sandbox service's snapshots of "
              f"{collect_service(args.dry_run)} ended kernel(s)")
    if not args.dry_run:
        from .backends.local.pool.spares import stop_all

        print(f"ended {stop_all()} spare pool(s) (LocalBackend.spare_sandbox; kernels start new ones)")
    if args.templates and not args.dry_run:
        from .backends.local.template import remove_all

        print(f"removed {remove_all()} start template(s)")
    return 0


def _cmd_pool(args: argparse.Namespace) -> int:
    from .backends.local.pool.daemon import main as pool_main
    from .errors import PolicyError
    from .options import flag_values
    from .policy import Policy
    from .workspace import resolve

    try:  # the same refusals as a kernel's (a pooled sandbox must match a kernel's resolved policy)
        policy = resolve(Policy(**policy_options(args)), os.getcwd())
    except PolicyError as err:
        print(f"sandbox-kernel pool: {err}", file=sys.stderr)
        return 2
    if policy.network != "none":  # a sandbox is made with its kernel's egress socket: no pooling
        print("sandbox-kernel pool: kernels with --network allowlist always start cold (their "
              "sandbox is bound to the kernel's own egress proxy); pool network=none kernels only",
              file=sys.stderr)
        return 2
    from .backends.local import LocalBackend

    local = flag_values(args, LocalBackend.SANDBOX_OPTIONS)
    return pool_main(policy, args.size, args.socket, status=args.status, **local)


def _cmd_service(args: argparse.Namespace) -> int:
    from .backends.local import LocalBackend
    from .backends.local.admission import Admission
    from .backends.local.service.server import PoolSpec
    from .backends.local.service.server import main as service_main
    from .errors import PolicyError
    from .options import flag_values
    from .policy import Policy
    from .workspace import resolve

    local = flag_values(args, LocalBackend.SANDBOX_OPTIONS)
    pool = None
    if args.pool_size:
        try:  # as `pool`: a pooled sandbox must match a kernel's resolved policy
            policy = resolve(Policy(**policy_options(args)), os.getcwd())
        except PolicyError as err:
            print(f"sandbox-kernel service: {err}", file=sys.stderr)
            return 2
        python = local.get("python") or ""
        if not python.startswith("/") or local.get("runtime", "gvisor") not in ("auto", "gvisor"):
            print("sandbox-kernel service: --pool-size needs --python, the kernels' interpreter (an absolute "
                  "path in an environment users cannot change), and the gvisor runtime", file=sys.stderr)
            return 2
        pool = PoolSpec(size=args.pool_size, policy=policy, python=python)
    headroom = flag_values(args, LocalBackend.ADMISSION_OPTIONS)
    low = [f"--{n.replace('_', '-')} {v} (at least 0)" for n, v in headroom.items() if v < 0]
    if args.max_images_per_uid < 1:
        low.append(f"--max-images-per-uid {args.max_images_per_uid} (at least 1)")
    if low:
        print(f"sandbox-kernel service: too low: {', '.join(low)}", file=sys.stderr)
        return 2
    admission = Admission(**headroom, set_by="service")
    return service_main(args.socket, runsc_path=local.get("runsc_path", ""),
                        gvisor_platform=local.get("gvisor_platform", "auto"), install_unit=args.install_unit,
                        pool=pool, admission=admission, max_images_per_uid=args.max_images_per_uid)


def _cmd_run(args: argparse.Namespace) -> int:
    import nbformat
    from nbclient.exceptions import CellExecutionError

    from .nbrun import NotebookRunner

    src = Path(args.notebook)
    out = Path(args.output) if args.output else Path("out") / src.name
    nb = nbformat.read(src, as_version=4)
    extra = [f"--SandboxKernel.{name}={value}" for name, value in
             (("workspace", args.workspace),
              ("workspace_path", args.workspace_path and os.path.abspath(args.workspace_path)))
             if value is not None]
    # The kernel starts in the notebook's folder, as Jupyter Server starts it.
    client = NotebookRunner(nb, kernel_name=args.kernel, timeout=args.timeout, extra_arguments=extra,
                            allow_errors=args.allow_errors,
                            resources={"metadata": {"path": args.cwd or str(src.resolve().parent)}})
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


def _cmd_mcp(args: argparse.Namespace) -> int:
    try:
        from .mcp.server import ServerOptions, build_server, serve_stdio
    except ImportError as err:
        print(f"sandbox-kernel mcp needs the MCP SDK: pip install 'sandbox-kernel[agents]' ({err})",
              file=sys.stderr)
        return 2
    options = ServerOptions(kernel_name=args.kernel_name, idle_shutdown_s=args.idle_shutdown_s,
                            max_output_bytes=args.max_output_bytes, default_budget_s=args.budget_s)
    if not args.http:
        serve_stdio(options)
        return 0
    from .mcp.http import serve_http, token_from_env

    token, generated = token_from_env()
    try:
        serve_http(build_server(options), args.host, args.port, token, announce_token=generated)
    except ValueError as err:
        print(f"sandbox-kernel mcp: {err}", file=sys.stderr)
        return 2
    return 0


def _backend_in(argv: list[str] | None) -> str:
    """The ``--backend`` of an ``install`` command line (its flags depend on it)."""
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--backend", default="local")
    return pre.parse_known_args(sys.argv[1:] if argv is None else argv)[0].backend


def build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    """The ``sandbox-kernel`` parser; ``install``'s backend flags are those of the
    ``--backend`` in ``argv`` (default: ``sys.argv``)."""
    parser = argparse.ArgumentParser(prog="sandbox-kernel", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("install", help="write a kernelspec (like python -m ipykernel install)",
                       description="Write a kernelspec. Every option of the kernel and of the backend "
                       "chosen is a flag (see `--backend e2b --help` for E2B's); docs/configuration.md "
                       "lists them all.")
    p.add_argument("--name", help="kernelspec name (default: sandbox-<backend>)")
    p.add_argument("--display-name", help="name shown in JupyterLab")
    p.add_argument("--backend", default="local", help="local (default), e2b, modal or ray")
    where = p.add_mutually_exclusive_group()
    where.add_argument("--user", action="store_true", help="install for the current user (the default for an "
                       "ordinary user outside a venv)")
    where.add_argument("--sys-prefix", action="store_true", help="install into sys.prefix (the default in a "
                       "venv, whose Jupyter finds its own kernelspecs first)")
    where.add_argument("--prefix", help="install into this prefix (none of the three, outside a venv and as "
                       "root: the system's, /usr/local/share/jupyter)")
    p.add_argument("--prestart", type=int, default=1, metavar="N",
                   help="spare proxies a Jupyter server keeps ready for this kernel, so a start or "
                   "restart does not wait for Python to import the proxy (default 1; 0: none). The "
                   "server's environment needs sandbox-kernel installed to list the kernel")
    p.set_defaults(func=_cmd_install, option_names=_install_flags(p, _backend_in(argv)))

    p = sub.add_parser("list", help="list installed sandbox kernelspecs")
    p.set_defaults(func=_cmd_list)

    p = sub.add_parser("doctor", help="which runtimes and backends work here, and what is missing")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--service-socket", help="the sandbox service's socket to ask (default: "
                   "/run/sandbox-kernel/service.sock)")
    p.set_defaults(func=_cmd_doctor)

    p = sub.add_parser("gc", help="find and remove orphaned sandboxes, end this user's spare pools")
    p.add_argument("--dry-run", action="store_true", help="only list them")
    p.add_argument("--templates", action="store_true", help="also remove this user's start templates "
                   "(LocalBackend.start_template); kernels then make new ones")
    p.set_defaults(func=_cmd_gc)

    p = sub.add_parser("pool", help="keep N sandboxes started for fast kernel starts (local backend)")
    p.add_argument("--size", type=int, default=2, help="sandboxes kept ready (default: 2)")
    p.add_argument("--socket", help="unix socket to listen on (default: <state dir>/pool.sock, "
                   "which kernels use unless LocalBackend.pool_socket says otherwise)")
    p.add_argument("--status", action="store_true", help="ask a running pool for its state and exit")
    p.set_defaults(func=_cmd_pool, option_names=_pool_flags(p))

    p = sub.add_parser("service", help="the sandbox service (root): gVisor sandboxes with cgroup limits, "
                       "pause and checkpoint/restore for ordinary users' kernels")
    p.add_argument("--socket", help="unix socket to listen on, mode 0666 (default: "
                   "/run/sandbox-kernel/service.sock, which kernels use unless LocalBackend.service_socket "
                   "says otherwise)")
    p.add_argument("--install-unit", nargs="?", const="/etc/systemd/system/sandbox-kernel.service",
                   metavar="PATH", help="write the systemd unit running this service (default path: "
                   "/etc/systemd/system/sandbox-kernel.service) and exit")
    p.add_argument("--pool-size", type=int, default=0, help="a warm pool: sandboxes kept started for the "
                   "kernels whose policy and interpreter (--python) the flags below give; others start cold "
                   "(default: 0, no pool)")
    _service_flags(p)
    p.set_defaults(func=_cmd_service, option_names=_pool_flags(p))

    p = sub.add_parser("mcp", help="an MCP server whose tools run code in a sandboxed kernel (stdio or HTTP)",
                       description="MCP server (the `agents` extra): one kernel per MCP session. Over stdio by "
                       "default; --http serves streamable HTTP on a loopback port, every request needing "
                       "'Authorization: Bearer <token>' with the token from $SANDBOX_KERNEL_MCP_TOKEN "
                       "(or a random one printed on stderr).")
    p.add_argument("--kernel-name", default="sandbox-local", help="kernelspec of each session's kernel "
                   "(default: sandbox-local)")
    p.add_argument("--idle-shutdown-s", type=float, default=0.0, help="seconds without a tool call after which "
                   "the session's kernel is shut down (the next call starts a new one); 0: never (default)")
    p.add_argument("--budget-s", type=float, default=30.0, help="seconds execute_code and wait wait by default "
                   "before returning a handle to a cell still running (default: 30)")
    p.add_argument("--max-output-bytes", type=int, default=20_000, help="cap on one tool result's text, bytes; "
                   "the rest is cut with a marker and readable by get_result (default: 20000)")
    p.add_argument("--http", action="store_true", help="serve streamable HTTP instead of stdio")
    p.add_argument("--host", default="127.0.0.1", help="with --http: loopback address to bind (default: 127.0.0.1)")
    p.add_argument("--port", type=int, default=8765, help="with --http: port; 0 picks a free one, printed on "
                   "stderr (default: 8765)")
    p.set_defaults(func=_cmd_mcp)

    p = sub.add_parser("run", help="execute a notebook through a sandboxed kernel (nbclient)")
    p.add_argument("notebook")
    p.add_argument("--kernel", default="sandbox-local", help="kernelspec name (default: sandbox-local)")
    p.add_argument("--output", "-o", help="where to write the executed notebook (default: out/<name>)")
    p.add_argument("--timeout", type=int, default=300, help="seconds per cell (default: 300)")
    p.add_argument("--allow-errors", action="store_true", help="keep going after a cell error")
    p.add_argument("--cwd", help="host working directory for the kernel process (default: the "
                   "notebook's folder)")
    p.add_argument("--workspace", choices=("none", "ro", "rw"), help="override the kernelspec's "
                   "SandboxKernel.workspace: expose the notebook's folder read-only or read-write")
    p.add_argument("--workspace-path", metavar="DIR", help="override SandboxKernel.workspace_path "
                   "(default: the kernel's working directory)")
    p.set_defaults(func=_cmd_run)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser(argv).parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
