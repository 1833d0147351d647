"""One option schema: every policy option is defined once and reaches every place.

Fast checks (no sandbox) that each ``Policy`` field is a ``SandboxKernel`` trait, a
flag of ``sandbox-kernel install`` and ``pool`` and a row of docs/configuration.md,
and that a value given on the command line reaches the kernel's policy unchanged;
``tighten``, the pool's key, backends as configurables and the old spellings.  Two
real kernels at the end: a bad option is an error reply naming it (the kernel
lives), and a kernelspec written in the old form still starts its sandbox.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
from pathlib import Path
from typing import Any

import pytest
from conftest import Kernel
from sandbox_kernel import cli
from sandbox_kernel.app import SandboxKernelApp
from sandbox_kernel.backends.base import SandboxBackend
from sandbox_kernel.backends.local import LocalBackend
from sandbox_kernel.backends.local.pool.wire import policy_key
from sandbox_kernel.errors import ConfigError, PolicyError
from sandbox_kernel.kernelspec import install, kernel_dict
from sandbox_kernel.options import KernelOptions, flag_values
from sandbox_kernel.policy import OPTIONS, OPTIONS_BY_NAME, Policy
from sandbox_kernel.proxy import SandboxKernel
from traitlets.config import Config, Configurable

ROOT = Path(__file__).resolve().parent.parent
log = logging.getLogger("test_options")


class Options(KernelOptions, Configurable):
    """``SandboxKernel``'s options without a kernel (no sockets, no session)."""


def options_from(config: Config) -> Options:
    cfg = Config(config)
    cfg.Options = config.SandboxKernel
    return Options(config=cfg)


EGRESS_SAMPLES: dict[str, Any] = {"allow_domains": ["pypi.org", "*.example.org"], "allow_ports": [8443, 443],
                                  "egress_resolve": {"pypi.test": "127.0.0.1:8080", "b.test": "[::1]"}}


def sample(name: str) -> Any:
    """A valid value for each policy option, other than its default (as a flag gives it)."""
    o = OPTIONS_BY_NAME[name]
    if name in EGRESS_SAMPLES:  # values the egress rules accept
        return EGRESS_SAMPLES[name]
    return {"int": lambda: o.default * 2, "float": lambda: o.default + 1.5,
            "choice": lambda: o.meta.choices[-1], "str": lambda: "/data/x",  # workspace_path: absolute
            "strings": lambda: ["/opt/a b", "/srv"], "mapping": lambda: {"K": "v = 1", "L": "true"}}[o.kind]()


def as_argv(name: str, value: Any) -> list[str]:
    flag = OPTIONS_BY_NAME[name].flag
    if isinstance(value, list):
        return [a for v in value for a in (flag, str(v))]
    if isinstance(value, dict):
        return [a for k, v in value.items() for a in (flag, f"{k}={v}")]
    return [flag, str(value)]


def parser_flags(command: str, argv: list[str]) -> set[str]:
    sub = next(a for a in cli.build_parser(argv)._actions if isinstance(a, argparse._SubParsersAction))
    return {s for a in sub.choices[command]._actions for s in a.option_strings}


# ---- every policy option, everywhere ---------------------------------------------------------


def test_every_policy_option_is_a_trait_a_flag_and_a_row():
    traits = SandboxKernel.class_traits(config=True)
    install_flags, pool_flags = parser_flags("install", ["install"]), parser_flags("pool", ["pool"])
    docs = (ROOT / "docs" / "configuration.md").read_text()
    for o in OPTIONS:
        t = traits[o.name]
        default = t.default()
        assert (tuple(sorted(default.items())) if isinstance(default, dict) else
                tuple(default) if isinstance(default, list) else default) == o.default, o.name
        assert f"Default: {o.default_text()}." in t.help, (o.name, t.help)
        assert not o.meta.unit or f"Unit: {o.meta.unit}." in t.help, (o.name, t.help)
        assert o.flag in install_flags and o.flag in pool_flags, o.name
        assert f"| `{o.name}` | `{o.flag}`" in docs, o.name
    assert Options().build_policy() == Policy()


def test_every_policy_option_goes_from_the_command_line_to_the_kernel_unchanged(tmp_path):
    """install flags -> kernel.json argv -> traitlets -> the kernel's Policy, for every field;
    and the same flags give the pool the same policy."""
    given = {o.name: sample(o.name) for o in OPTIONS}
    argv = [a for name, value in given.items() for a in as_argv(name, value)]
    expected = Policy(**{o.name: (tuple(sorted(v.items())) if isinstance(v, dict) else
                                  tuple(v) if isinstance(v, list) else v) for o, v in zip(OPTIONS, given.values())})
    assert cli.main(["install", "--prefix", str(tmp_path), "--name", "every", *argv]) == 0
    spec = json.loads(next(tmp_path.rglob("every/kernel.json")).read_text())
    app = SandboxKernelApp()
    app.parse_command_line(spec["argv"][spec["argv"].index("{connection_file}") + 1:])
    assert options_from(app.config).build_policy() == expected
    args = cli.build_parser(["pool", *argv]).parse_args(["pool", *argv])
    assert Policy(**cli.policy_options(args)) == expected


def test_install_writes_backend_options_as_the_backends_own(tmp_path):
    argv = ["install", "--prefix", str(tmp_path), "--name", "b", "--runtime", "bubblewrap", "--pool-socket", "",
            "--ready-timeout-s", "30", "--no-lifecycle-notices", "--env", "A=1"]
    assert cli.main(argv) == 0
    spec = json.loads(next(tmp_path.rglob("b/kernel.json")).read_text())
    assert spec["argv"][5:] == ["--SandboxKernel.backend=local", "--SandboxKernel.env=A=1",
                                "--SandboxKernel.lifecycle_notices=False", "--LocalBackend.pool_socket=",
                                "--LocalBackend.ready_timeout_s=30.0", "--LocalBackend.runtime=bubblewrap"]
    assert spec["display_name"] == "Python 3 (sandbox: local, bubblewrap)"
    e2b = kernel_dict("e2b", {"template": "t", "deadman_s": 60, "memory_mib": 1024})
    assert e2b["argv"][5:] == ["--SandboxKernel.backend=e2b", "--E2BBackend.template=t",
                               "--E2BBackend.deadman_s=60", "--SandboxKernel.memory_mib=1024"]
    assert e2b["display_name"] == "Python 3 (sandbox: E2B, 1024 MiB)"
    with pytest.raises(ConfigError, match="neither a SandboxKernel option nor one of the e2b"):
        kernel_dict("e2b", {"runtime": "gvisor"})


def test_cli_refuses_a_bad_policy_value_at_once(tmp_path, capsys):
    assert cli.main(["install", "--prefix", str(tmp_path), "--memory-mib", "64"]) == 2
    assert "memory_mib=64" in capsys.readouterr().err and not list(tmp_path.rglob("kernel.json"))
    assert cli.main(["pool", "--pids-max", "1"]) == 2
    assert "pids_max=1" in capsys.readouterr().err


def test_pool_flags_carry_the_local_sandbox_options():
    argv = ["pool", "--runtime", "bubblewrap", "--python", "/usr/bin/python3", "--memory-mib", "512"]
    args = cli.build_parser(argv).parse_args(argv)
    assert flag_values(args, ("runtime", "python")) == {"runtime": "bubblewrap", "python": "/usr/bin/python3"}
    assert cli.policy_options(args) == {"memory_mib": 512}


def test_service_flags_carry_its_bounds_and_refuse_values_under_them(capsys):
    """``sandbox-kernel service``: ``--max-images-per-uid`` and the admission headrooms parsed (the
    tests of ``test_service_copies.py`` run it so), and a value under its least refused before
    anything starts."""
    argv = ["service", "--max-images-per-uid", "2", "--memory-headroom-mib", "100", "--memory-overcommit", "1.5"]
    args = cli.build_parser(argv).parse_args(argv)
    assert args.max_images_per_uid == 2
    assert flag_values(args, LocalBackend.ADMISSION_OPTIONS) == {"memory_headroom_mib": 100, "memory_overcommit": 1.5}
    assert cli.build_parser(["service"]).parse_args(["service"]).max_images_per_uid == 32
    assert cli.main(["service", "--max-images-per-uid", "0", "--pids-headroom", "-1"]) == 2
    assert "too low: --pids-headroom -1 (at least 0), --max-images-per-uid 0 (at least 1)" in capsys.readouterr().err


# ---- the policy: validation, tighten, the pool key -------------------------------------------


@pytest.mark.parametrize("field,value,words", [
    ("memory_mib", 64, "at least 128 MiB"), ("pids_max", True, "integer"), ("cpu_cores", float("inf"), "finite"),
    ("pause_after_s", -1.0, ">= 0"), ("network", "host", "one of"), ("output_policy", "open", "one of"),
    ("ro_paths", ("/proc",), "not /, /proc"), ("env", (("MODAL_TOKEN_ID", "x"),), "credentials"),
    ("trusted_comm_targets", ("a", 1), "strings"),
])
def test_validate_names_the_field_and_value(field, value, words):
    with pytest.raises(PolicyError, match=words) as info:
        Policy(**{field: value})
    assert info.value.field == field and f"{field}=" in str(info.value)


def test_tighten_allows_only_tighter_values():
    op = Policy(memory_mib=2048, cell_timeout_s=0, pause_after_s=600, output_policy="trust",
                trusted_widget_modules=("a", "b"))
    p = op.tighten({"memory_mib": 1024, "cell_timeout_s": 30, "pause_after_s": 60,
                    "output_policy": "sanitize", "trusted_widget_modules": ["a"]})
    assert (p.memory_mib, p.cell_timeout_s, p.pause_after_s, p.output_policy, p.trusted_widget_modules) == \
        (1024, 30, 60, "sanitize", ("a",))
    assert op.tighten({}) == op
    for overrides, words in [({"memory_mib": 4096}, "at most 2048"), ({"pause_after_s": 0}, "cannot switch off"),
                             ({"pause_after_s": 601}, "at most 600"),
                             ({"output_policy": "trust"}, None), ({"trusted_widget_modules": ["c"]}, "remove"),
                             ({"env": ()}, "cannot be overridden"), ({"ro_paths": ()}, "cannot be overridden"),
                             ({"no_such": 1}, "cannot be overridden"), ({"memory_mib": "1"}, "integer"),
                             ({"memory_mib": 100}, "at least 128")]:
        if words is None:
            assert op.tighten(overrides).output_policy == "trust"  # the same value is not looser
            continue
        with pytest.raises(PolicyError, match=words):
            op.tighten(overrides)
    with pytest.raises(PolicyError, match="may only tighten"):
        Policy().tighten({"output_policy": "trust"})


def test_what_tightens_comes_from_the_metadata():
    """Every overridable field is a number that shrinks, a choice or a list (nothing hand-listed)."""
    kinds = {o.name: (o.kind, o.meta.tighten) for o in OPTIONS if o.meta.tighten}
    assert all(k in ("int", "float") for k, how in kinds.values() if how == "smaller")
    assert all(k == "choice" for k, how in kinds.values() if how == "choice")
    assert all(k in ("strings", "ints") for k, how in kinds.values() if how == "subset")
    assert {"memory_mib", "cpu_cores", "pids_max", "cell_timeout_s", "output_policy"} <= set(kinds)


def test_the_pool_key_counts_what_a_sandbox_is_made_with():
    base = policy_key(Policy(), "gvisor", "/venv/bin/python")
    for o in OPTIONS:
        other = Policy(**{o.name: tuple(sorted(v.items())) if isinstance(v := sample(o.name), dict) else
                          tuple(v) if isinstance(v, list) else v})
        if other == Policy():  # a single choice (network: only "none" exists)
            continue
        same = policy_key(other, "gvisor", "/venv/bin/python") == base
        assert same == (o.scope == "proxy"), o.name
    assert policy_key(Policy(), "bubblewrap", "/venv/bin/python") != base
    assert policy_key(Policy(), "gvisor", "/other/bin/python") != base


# ---- backends as configurables ---------------------------------------------------------------


def test_backends_take_their_options_from_the_configuration():
    from sandbox_kernel.backends.e2b import E2BBackend
    from sandbox_kernel.backends.modal import ModalBackend

    cfg = Config()
    cfg.E2BBackend.template = "tpl"
    cfg.ModalBackend.gpu = "T4"
    cfg.SandboxBackend.refresh_every_s = 12.0
    parent = Configurable(config=cfg)
    e2b = E2BBackend(Policy(), "k", parent=parent)
    modal = ModalBackend(Policy(), "k", parent=parent, idle_timeout_s=5)
    local = LocalBackend(Policy(), "k", parent=parent, runtime="bubblewrap")
    assert (e2b.template, e2b.ready_timeout_s, e2b.refresh_every_s) == ("tpl", 180.0, 12.0)
    assert (modal.gpu, modal.idle_timeout_s, modal.refresh_every_s) == ("T4", 5, 12.0)
    assert (local.runtime_name, local.ready_timeout_s, local.refresh_every_s) == ("bubblewrap", 150.0, 12.0)
    assert isinstance(e2b, SandboxBackend) and e2b.log.name == "sandbox_kernel.backends.e2b"


def test_backends_declare_what_they_enforce():
    from sandbox_kernel.backends.e2b import E2BBackend
    from sandbox_kernel.backends.modal import ModalBackend

    sandbox = {o.name for o in OPTIONS if o.scope == "sandbox"}
    for cls in (LocalBackend, E2BBackend, ModalBackend):
        assert cls.enforced_fields <= sandbox and cls.display_name, cls
    assert E2BBackend.check_policy(Policy()) == ["memory_mib", "cpu_cores", "pids_max", "scratch_mib"]
    assert E2BBackend.check_policy(Policy(ro_paths=("/opt",)))[0] == "ro_paths"
    assert ModalBackend.check_policy(Policy()) == ["pids_max", "scratch_mib"]
    assert LocalBackend.check_policy(Policy()) == ["lifetime_s"]


def test_the_old_spellings_still_configure_the_backend(caplog):
    caplog.set_level(logging.WARNING)
    cfg = Config()
    cfg.SandboxKernel.runtime = "bubblewrap"
    cfg.SandboxKernel.backend_options = {"pool_socket": "", "ready_timeout_s": 9.0}
    backend = options_from(cfg).build_backend(Policy(), "k", log)
    assert (backend.runtime_name, backend.pool_path, backend.ready_timeout_s) == ("bubblewrap", None, 9.0)
    assert "--SandboxKernel.runtime is deprecated: use --LocalBackend.runtime" in caplog.text
    cfg.LocalBackend.runtime = "auto"  # the new spelling wins
    assert options_from(cfg).build_backend(Policy(), "k", log).runtime == "auto"
    assert "--SandboxKernel.runtime is deprecated and ignored: --LocalBackend.runtime is set" in caplog.text
    cfg = Config()
    cfg.SandboxKernel.backend = "e2b"
    cfg.SandboxKernel.python = "/usr/bin/python3"  # the local backend's host path: not E2B's python
    cfg.SandboxKernel.backend_options = {"template": "t"}
    backend = options_from(cfg).build_backend(Policy(), "k", log)
    assert (backend.template, backend.python) == ("t", "python3")


@pytest.mark.parametrize("section,name,value,words", [
    ("LocalBackend", "runtme", "gvisor", "option LocalBackend.runtme='gvisor': the local backend has no such "
                                         "option; did you mean runtime?"),
    ("SandboxBackend", "ready_timeout", 5, "option SandboxBackend.ready_timeout=5: .* did you mean ready_timeout_s"),
    ("LocalBackend", "runtime", "firecracker", "option LocalBackend.runtime='firecracker': The 'runtime' trait"),
    ("LocalBackend", "python", "python3", "option LocalBackend.python='python3': .*absolute"),
    ("SandboxKernel", "backend_options", {"nope": 1}, r"option LocalBackend.nope=1: the local backend has no"),
])
def test_a_bad_backend_option_is_a_config_error_naming_it(section, name, value, words):
    cfg = Config()
    cfg[section][name] = value
    with pytest.raises(ConfigError, match=words):
        options_from(cfg).build_backend(Policy(), "k", log)


# ---- real kernels --------------------------------------------------------------------------------


def _install_argv(prefix: str, name: str, extra: list[str]) -> str:
    install(name, options={"runtime": "bubblewrap"}, prefix=prefix)
    path = next(Path(prefix).rglob(f"{name}/kernel.json"))
    spec = json.loads(path.read_text())
    spec["argv"] = [a for a in spec["argv"] if not a.startswith("--LocalBackend.")] + extra
    path.write_text(json.dumps(spec))
    return name


@pytest.mark.parametrize("extra,words", [
    (["--LocalBackend.runtme=gvisor"], "LocalBackend.runtme='gvisor': the local backend has no such option; "
                                       "did you mean runtime?"),
    (["--SandboxKernel.memory_mib=64"], "policy field memory_mib=64: must be an integer of at least 128 MiB"),
])
def test_a_bad_option_is_an_error_reply_and_the_kernel_lives(kernelspec_prefix, extra, words):
    k = Kernel(_install_argv(kernelspec_prefix, "sandbox-test-bad-option", extra))
    try:
        for _ in range(2):
            r = k.execute("1 + 1")
            assert r.ename == "SandboxUnavailable" and words in r.reply["content"]["evalue"], r.reply["content"]
            assert [o["content"]["ename"] for o in r.of_type("error")] == ["SandboxUnavailable"]
        assert words in k.sandbox_info()["error"] and k.km.is_alive()
    finally:
        k.shutdown()


def test_a_refused_start_is_said_at_kernel_info_and_the_kernel_offers_nothing_it_cannot_do(kernelspec_prefix):
    """Admission refuses the sandbox (more headroom asked for than the machine has; no spare
    sandbox, which admission counted when it was made and which another test's kernels of the
    same policy may have left ready): the first
    kernel_info_reply, as a frontend asks on connecting, already says so (the numbers in
    ``sandbox.error``, and first in the banner a console prints), offers neither subshells nor
    the debugger, and each cell then says the same; the kernel process lives."""
    k = Kernel(_install_argv(kernelspec_prefix, "sandbox-test-refused",
                             ["--LocalBackend.runtime=bubblewrap", "--LocalBackend.memory_headroom_mib=100000000",
                              "--LocalBackend.spare_sandbox=False"]))
    try:
        info = k.kc.kernel_info(reply=True, timeout=60)["content"]
        error = info["sandbox"]["error"]
        assert info["status"] == "ok" and "not enough memory on this machine" in error and "100000000 MiB" in error
        assert info["banner"].startswith(f"sandbox-kernel: no sandbox: {error}")
        assert info["supported_features"] == []
        r = k.execute("1 + 1")
        assert r.ename == "AdmissionRefused" and "100000000 MiB" in r.reply["content"]["evalue"]
        assert k.km.is_alive()
    finally:
        k.shutdown()


def test_a_kernelspec_in_the_old_form_still_starts(kernelspec_prefix):
    """What `sandbox-kernel install` wrote before backends were configurable."""
    k = Kernel(_install_argv(kernelspec_prefix, "sandbox-test-old-form", [
        "--SandboxKernel.runtime=bubblewrap", "--SandboxKernel.backend_options={'pool_socket': ''}",
        "--SandboxKernel.env={'OLD_FORM': 'yes'}"]))
    try:
        r = k.execute("import os; os.environ['OLD_FORM']")
        assert r.result_text == "'yes'", r.reply["content"]
        info = k.sandbox_info()
        assert info["runtime"] == "bubblewrap" and info["pooled"] is False
        assert info["unenforced"] == ["lifetime_s"]
    finally:
        k.shutdown()


def test_check_policy_is_what_a_kernel_warns_about():
    """The warning at start and ``describe()`` come from the same declaration."""
    backend = LocalBackend(Policy(), "k", runtime="bubblewrap")
    assert backend.describe()["unenforced"] == backend.check_policy(Policy()) == ["lifetime_s"]
    assert asyncio.run(backend.doctor()) == []


def test_a_config_file_sets_options_and_kernelspec_argv_wins(kernelspec_prefix, tmp_path):
    """docs/configuration.md: ``sandbox_kernel_config.py`` in the IPython profile is read by
    the proxy, the kernelspec's argv wins over it, and it is never carried into the sandbox
    (``forward_ipython_config`` carries ``ipython_config.py`` and ``ipython_kernel_config.py``)."""
    name = "sandbox-test-config-file"
    install(name, options={"runtime": "bubblewrap", "memory_mib": 512}, prefix=kernelspec_prefix)
    profile = tmp_path / "ipython" / "profile_default"
    profile.mkdir(parents=True)
    (profile / "sandbox_kernel_config.py").write_text(
        "c.SandboxKernel.memory_mib = 640\n"
        "c.SandboxKernel.env = {'FROM_CONFIG_FILE': 'yes'}\n")
    k = Kernel(name, env={**os.environ, "IPYTHONDIR": str(tmp_path / "ipython")})
    try:
        r = k.execute("import os; os.environ.get('FROM_CONFIG_FILE')")
        assert r.result_text == "'yes'", r.reply["content"]
        info = k.sandbox_info()
        assert info["limits"]["memory_mib"] == 512
        assert info["ipython_config"]["config_files"] == []
    finally:
        k.shutdown()
