"""Runtime argv and OCI spec built from the policy: golden lists and ordering rules."""

import dataclasses

from sandbox_kernel.backends.local.bwrap import bwrap_argv
from sandbox_kernel.backends.local.gvisor import oci_config
from sandbox_kernel.backends.local.layout import HostLayout
from sandbox_kernel.backends.local.resource_view import ResourceView
from sandbox_kernel.backends.local.runsc import runsc_argv
from sandbox_kernel.policy import Policy

LAYOUT = HostLayout(
    python="/tmp/ci/.venv/bin/python",
    ro_dirs=("/tmp/ci/.venv", "/root/.pyenv/versions/3.11.7"),
    etc_entries=("ld.so.cache",),
    usr_links=(("/bin", "usr/bin"),),
    usr_dirs=("/usr",),
)
POLICY = Policy(scratch_mib=64, env=(("MY_VAR", "1"),))


def test_bwrap_argv_golden():
    argv = bwrap_argv(POLICY, LAYOUT, etc_dir="/state/etc", seccomp_fd=7, command=["/bin/true"])
    env_start = argv.index("--setenv")
    assert argv[:env_start] == [
        "bwrap",
        "--unshare-all", "--unshare-user", "--disable-userns",
        "--die-with-parent", "--new-session", "--clearenv",
        "--as-pid-1",
        "--uid", "65534", "--gid", "65534",
        "--hostname", "sandbox",
        "--proc", "/proc",
        "--dev", "/dev",
        "--perms", "1777", "--size", str(64 * 1024 * 1024), "--tmpfs", "/tmp",
        "--perms", "0700", "--size", str(64 * 1024 * 1024), "--tmpfs", "/home/sandbox",
        "--ro-bind", "/usr", "/usr",
        "--symlink", "usr/bin", "/bin",
        "--dir", "/etc",
        "--ro-bind", "/state/etc/passwd", "/etc/passwd",
        "--ro-bind", "/state/etc/group", "/etc/group",
        "--ro-bind", "/state/etc/hosts", "/etc/hosts",
        "--ro-bind", "/state/etc/hostname", "/etc/hostname",
        "--ro-bind", "/etc/ld.so.cache", "/etc/ld.so.cache",
        "--ro-bind", "/tmp/ci/.venv", "/tmp/ci/.venv",
        "--ro-bind", "/root/.pyenv/versions/3.11.7", "/root/.pyenv/versions/3.11.7",
        "--ro-bind", argv[argv.index("/opt/sandbox-kernel/agent.pyz") - 1], "/opt/sandbox-kernel/agent.pyz",
        "--remount-ro", "/",
        "--chdir", "/home/sandbox",
    ]
    assert argv[-4:] == ["--seccomp", "7", "--", "/bin/true"]
    env = dict(zip(argv[env_start + 1:-4:3], argv[env_start + 2:-4:3]))
    assert env["HOME"] == "/home/sandbox" and env["MY_VAR"] == "1"
    assert env["PATH"].startswith("/tmp/ci/.venv/bin:")


def test_no_writable_host_path_unless_asked():
    argv = bwrap_argv(POLICY, LAYOUT, etc_dir="/e", seccomp_fd=3)
    assert "--bind" not in argv
    argv = bwrap_argv(POLICY, LAYOUT, etc_dir="/e", seccomp_fd=3, rw_binds={"/host/dir": "/tmp"})
    i = argv.index("--bind")
    assert argv[i:i + 3] == ["--bind", "/host/dir", "/tmp"]
    # read-only binds below a writable one land on top of it (a venv under /tmp stays visible)
    assert i < argv.index("/tmp/ci/.venv")


def test_scratch_tmpfs_is_mounted_before_binds_below_it():
    """A venv under /tmp must not be hidden by the /tmp tmpfs (CI clones into /tmp)."""
    argv = bwrap_argv(POLICY, LAYOUT, etc_dir="/e", seccomp_fd=3)
    assert argv.index("/tmp") < argv.index("/tmp/ci/.venv")
    mounts = [m["destination"] for m in oci_config(POLICY, LAYOUT, etc_dir="/e")["mounts"]]
    assert mounts.index("/tmp") < mounts.index("/tmp/ci/.venv")


def test_oci_config_is_locked_down():
    cfg = oci_config(POLICY, LAYOUT, etc_dir="/e", command=["/bin/true"])
    proc = cfg["process"]
    assert proc["user"] == {"uid": 65534, "gid": 65534, "additionalGids": []}
    assert proc["noNewPrivileges"] is True
    assert all(v == [] for v in proc["capabilities"].values())
    assert cfg["root"] == {"path": "rootfs", "readonly": True}
    assert {n["type"] for n in cfg["linux"]["namespaces"]} >= {"pid", "network", "ipc", "uts", "mount"}
    binds = [m for m in cfg["mounts"] if m["type"] == "bind"]
    assert binds and all("ro" in m["options"] for m in binds)
    assert not any(e.startswith(("E2B_", "MODAL_", "JPY_")) for e in proc["env"])
    assert cfg["linux"]["resources"]["memory"]["limit"] == POLICY.memory_mib * 1024 * 1024


def test_oci_agent_is_root_of_the_sandbox_with_few_capabilities_and_the_interpreter_is_not():
    """The agent's channel is out of the interpreter's reach because they differ in uid."""
    proc = oci_config(POLICY, LAYOUT, etc_dir="/e")["process"]
    assert proc["user"] == {"uid": 0, "gid": 0, "additionalGids": []}
    assert proc["capabilities"]["bounding"] == ["CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_KILL",
                                                "CAP_SETGID", "CAP_SETUID"]
    assert proc["capabilities"]["inheritable"] == proc["capabilities"]["ambient"] == []
    assert proc["noNewPrivileges"] is True
    assert proc["args"][-2:] == ["--kernel-user", "65534"]


def test_runsc_flags_close_the_network():
    assert runsc_argv("/state/runsc") == ["runsc", "--root", "/state/runsc", "--network=none", "--platform=ptrace"]


def test_bwrap_binds_the_resource_view_over_proc_and_a_fresh_sys():
    """C15: the generated meminfo, cpuinfo and CPU lists, right after /proc is mounted."""
    view = ResourceView(cpus=(1,), dir="/state/view")
    argv = bwrap_argv(POLICY, LAYOUT, etc_dir="/state/etc", seccomp_fd=7, command=["/bin/true"], view=view)
    i = argv.index("--proc")
    assert argv[i:argv.index("--dev")] == [
        "--proc", "/proc",
        "--ro-bind", "/state/view/meminfo", "/proc/meminfo",
        "--ro-bind", "/state/view/cpuinfo", "/proc/cpuinfo",
        "--dir", "/sys/devices/system/cpu",
        "--ro-bind", "/state/view/cpu-online", "/sys/devices/system/cpu/online",
        "--ro-bind", "/state/view/cpu-online", "/sys/devices/system/cpu/possible",
        "--ro-bind", "/state/view/cpu-online", "/sys/devices/system/cpu/present",
    ]
    # otherwise the same argv as without a view
    plain = bwrap_argv(POLICY, LAYOUT, etc_dir="/state/etc", seccomp_fd=7, command=["/bin/true"])
    assert argv[:i + 2] + argv[argv.index("--dev"):] == plain


def test_oci_resources_carry_the_sandbox_cpus():
    """C15: runsc makes a cpuset of ``cpu.cpus``, and the sentry reports that many CPUs."""
    cpu = oci_config(POLICY, LAYOUT, etc_dir="/e", cpus=(1,))["linux"]["resources"]["cpu"]
    assert cpu == {"quota": 200_000, "period": 100_000, "cpus": "1"}
    cpu = oci_config(POLICY, LAYOUT, etc_dir="/e", cpus=(0, 1, 2, 5))["linux"]["resources"]["cpu"]
    assert cpu["cpus"] == "0-2,5"
    assert "cpus" not in oci_config(POLICY, LAYOUT, etc_dir="/e")["linux"]["resources"]["cpu"]


def test_jedi_seed_is_bound_read_only_on_both_runtimes():
    """C16: the host-built jedi cache, read-only at one path, after the agent."""
    layout = dataclasses.replace(LAYOUT, jedi_seed="/state/jedi-cache/k1/b1")
    argv = bwrap_argv(POLICY, layout, etc_dir="/e", seccomp_fd=3, command=["/bin/true"])
    i = argv.index("/opt/sandbox-kernel/jedi-cache")
    assert argv[i - 2:i + 1] == ["--ro-bind", "/state/jedi-cache/k1/b1", "/opt/sandbox-kernel/jedi-cache"]
    assert argv.index("/opt/sandbox-kernel/agent.pyz") < i < argv.index("--remount-ro")
    assert "/opt/sandbox-kernel/jedi-cache" not in bwrap_argv(POLICY, LAYOUT, etc_dir="/e", seccomp_fd=3)
    mounts = oci_config(POLICY, layout, etc_dir="/e")["mounts"]
    assert {"destination": "/opt/sandbox-kernel/jedi-cache", "type": "bind", "source": "/state/jedi-cache/k1/b1",
            "options": ["rbind", "ro", "nosuid", "nodev"]} in mounts
    assert not any(m["destination"] == "/opt/sandbox-kernel/jedi-cache"
                   for m in oci_config(POLICY, LAYOUT, etc_dir="/e")["mounts"])


def test_egress_socket_bound_and_env_only_with_an_allowlist():
    """network=allowlist: the socket's folder bound read-only, runsc --host-uds=open, the
    proxy variables and pip's index allowed; network=none: none of it (issue 17)."""
    from sandbox_kernel.backends.local.gvisor import oci_flags

    policy = Policy(network="allowlist", allow_domains=("pypi.org",))
    eg = dataclasses.replace(LAYOUT, egress_dir="/run/sk/x/egress")
    argv = bwrap_argv(policy, eg, etc_dir="/e", seccomp_fd=3)
    assert ["--ro-bind", "/run/sk/x/egress", "/opt/sandbox-kernel/egress"] == argv[
        argv.index("/run/sk/x/egress") - 1:argv.index("/run/sk/x/egress") + 2]
    assert "HTTPS_PROXY" in argv and "http://127.0.0.1:3128" in argv and "PIP_NO_INDEX" not in argv
    assert argv[argv.index("--egress-socket") + 1] == "/opt/sandbox-kernel/egress/proxy.sock"
    spec = oci_config(policy, eg, etc_dir="/e")
    assert {"destination": "/opt/sandbox-kernel/egress", "type": "bind", "source": "/run/sk/x/egress",
            "options": ["rbind", "ro", "nosuid", "nodev"]} in spec["mounts"]
    assert oci_flags(spec) == ["--host-uds=open"] and oci_flags(oci_config(Policy(), LAYOUT, etc_dir="/e")) == []
    plain = bwrap_argv(Policy(), LAYOUT, etc_dir="/e", seccomp_fd=3)
    assert "PIP_NO_INDEX" in plain and not any(a.startswith(("--egress", "HTTP", "/opt/sandbox-kernel/egress")) for a in plain)


def test_sandbox_env_keeps_freed_heap_for_reuse_and_the_policy_env_wins():
    """A page fault costs a trip to the Sentry under gVisor, and one per page anywhere: large
    freed blocks stay in the heap in every sandbox (base.MALLOC_ENV, part of the environment
    every backend gives); an operator's ``env`` may set other values."""
    def oci_env(policy):
        return dict(e.split("=", 1) for e in oci_config(policy, LAYOUT, etc_dir="/e")["process"]["env"])

    def bwrap_env(policy):
        argv = bwrap_argv(policy, LAYOUT, etc_dir="/e", seccomp_fd=3)
        return {argv[i + 1]: argv[i + 2] for i, a in enumerate(argv) if a == "--setenv"}

    for env in (oci_env, bwrap_env):
        assert env(POLICY)["MALLOC_MMAP_THRESHOLD_"] == str(32 << 20)
        assert env(POLICY)["MALLOC_TRIM_THRESHOLD_"] == str(64 << 20)
        tuned = dataclasses.replace(POLICY, env=(("MALLOC_TRIM_THRESHOLD_", "0"),))
        assert env(tuned)["MALLOC_TRIM_THRESHOLD_"] == "0"


def test_rw_workspace_refuses_set_id_modes_and_binds_its_id_mapped_clone():
    """Issue 33: a rw workspace's files land on the host as the kernel's user's, so no cell may
    make a set-id file there: ``linux.seccomp`` (runsc --oci-seccomp) and bubblewrap's filter
    refuse set-id modes; the spec binds the id-mapped clone (its staging point) instead of the
    folder; ro and none are unchanged."""
    from sandbox_kernel.backends.local import seccomp
    from sandbox_kernel.backends.local.gvisor import oci_flags

    rw = dataclasses.replace(LAYOUT, workspace="/srv/project", workspace_rw=True, workspace_ro_subdirs=(".git",))
    spec = oci_config(Policy(workspace="rw"), rw, etc_dir="/e", workspace_source="/state/x/workspace")
    sources = {m["destination"]: m["source"] for m in spec["mounts"]}
    assert sources["/home/sandbox/work"] == "/state/x/workspace"
    assert sources["/home/sandbox/work/.git"] == "/state/x/workspace/.git"
    rules = spec["linux"]["seccomp"]["syscalls"]
    assert spec["linux"]["seccomp"]["defaultAction"] == "SCMP_ACT_ALLOW" and oci_flags(spec) == ["--oci-seccomp"]
    fchmodat = [r["args"][0] for r in rules if r["names"] == ["fchmodat"]]
    assert fchmodat == [{"index": 2, "value": 0o4000, "valueTwo": 0o4000, "op": "SCMP_CMP_MASKED_EQ"},
                        {"index": 2, "value": 0o2000, "valueTwo": 0o2000, "op": "SCMP_CMP_MASKED_EQ"}]
    assert {"names": ["io_uring_setup", "openat2"], "action": "SCMP_ACT_ERRNO", "errnoRet": 38} in rules
    ro = oci_config(Policy(workspace="ro"), dataclasses.replace(rw, workspace_rw=False), etc_dir="/e")
    assert "seccomp" not in ro["linux"] and oci_flags(ro) == []
    plain, guarded = seccomp.build_filter("x86_64"), seccomp.build_filter("x86_64", no_setid=True)
    assert guarded[:48] == plain[:48] and guarded.endswith(plain[48:])  # checks inserted, deny-list kept
    assert len(guarded) - len(plain) == 8 * (5 * len(seccomp.SETID_SYSCALLS) + 2 * len(seccomp.SETID_UNCHECKABLE))
