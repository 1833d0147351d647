"""Runtime argv and OCI spec built from the policy: golden lists and ordering rules."""

from sandbox_kernel.backends.local.bwrap import bwrap_argv
from sandbox_kernel.backends.local.gvisor import oci_config, runsc_argv
from sandbox_kernel.backends.local.layout import HostLayout
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
        "--ro-bind", argv[argv.index("/opt/sandbox-kernel/agent.py") - 1], "/opt/sandbox-kernel/agent.py",
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
