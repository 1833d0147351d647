"""The POSIX facilities a normal Linux process expects, as one table (issue 18 item 6).

:data:`EXPECTED` says, for each probe of :data:`PROBE` (which runs
as a cell in the sandbox), what a stock kernel on a normal machine gives;
:func:`check` runs the probe through a kernel and returns every mismatch.
Used for both local runtimes (``tests/test_posix.py``) and the E2B and Modal
emulations (``tests/backends/test_cloud_kernels.py``).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from typing import Any

#: The cell (it runs only inside a sandbox, as a cell; a string here so that nothing,
#: not even pytest's module collection, runs it on the host).
PROBE = r'''
import json, os, getpass, locale, time, multiprocessing as mp, pathlib, sys
res = {}
def t(name, f):
    try: res[name] = f()
    except Exception as e: res[name] = f"ERR {type(e).__name__}: {e}"
for d in ("null", "zero", "full", "random", "urandom", "tty", "shm", "pts"):
    t("dev_" + d, lambda d=d: os.path.exists("/dev/" + d))
t("dev_null_write", lambda: open("/dev/null", "w").write("x"))
t("dev_zero_read", lambda: open("/dev/zero", "rb").read(4) == b"\0" * 4)
t("dev_urandom_read", lambda: len(open("/dev/urandom", "rb").read(16)))
def full():
    try:
        with open("/dev/full", "w") as f: f.write("x"); f.flush()
    except OSError as e: return e.errno
t("dev_full_enospc", full)
t("shm_writable", lambda: os.access("/dev/shm", os.W_OK))
t("getuser", getpass.getuser)
t("home", lambda: os.path.expanduser("~"))
t("home_writable", lambda: os.access(os.path.expanduser("~"), os.W_OK))
t("pwd_entry", lambda: __import__("pwd").getpwuid(os.getuid()).pw_name)
t("grp_entry", lambda: __import__("grp").getgrgid(os.getgid()).gr_name)
t("localtime", lambda: os.path.exists("/etc/localtime"))
t("zoneinfo", lambda: str(__import__("zoneinfo").ZoneInfo("Europe/Paris")))
t("tzname", lambda: time.tzname)
t("locale", lambda: locale.setlocale(locale.LC_ALL, ""))
t("preferred_encoding", lambda: locale.getpreferredencoding())
t("fs_encoding", sys.getfilesystemencoding)
t("tmp_writable", lambda: os.access("/tmp", os.W_OK))
t("hostname", lambda: __import__("socket").gethostname())
t("etc_hosts_localhost", lambda: __import__("socket").gethostbyname("localhost"))
t("cpu_count", os.cpu_count)
t("sched_affinity", lambda: len(os.sched_getaffinity(0)))
t("mem_total_mib", lambda: int(open("/proc/meminfo").read().split()[1]) // 1024)
t("sysconf_pages_mib", lambda: os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // 2**20)
t("ssl_certs", lambda: __import__("ssl").create_default_context().cert_store_stats()["x509_ca"] > 0)
t("mime_types", lambda: __import__("mimetypes").guess_type("a.csv")[0])
t("uname", lambda: os.uname().sysname)
t("ulimit_nofile", lambda: __import__("resource").getrlimit(__import__("resource").RLIMIT_NOFILE)[0])
import math
for m in ("fork", "spawn", "forkserver"):
    def run(m=m):
        with mp.get_context(m).Pool(2) as p: return p.map(math.factorial, range(5))
    t("pool_" + m, run)
t("mp_lock", lambda: bool(mp.Lock()))
t("shared_memory", lambda: __import__("multiprocessing.shared_memory", fromlist=["x"]).SharedMemory(create=True, size=10).unlink() is None)
t("subprocess_ls", lambda: __import__("subprocess").run(["ls", "/"], capture_output=True).returncode)
t("threads_32", lambda: [th.start() or th for th in [__import__("threading").Thread(target=time.sleep, args=(0.01,)) for _ in range(32)]] and True)
print(json.dumps(res))
'''
FACTORIALS = [math.factorial(i) for i in range(5)]

#: probe name -> predicate on its value (True: as on a normal machine).
EXPECTED: dict[str, Callable[[Any], bool]] = {
    **{f"dev_{d}": (lambda v: v is True) for d in ("null", "zero", "full", "random", "urandom", "shm")},
    "dev_null_write": lambda v: v == 1,
    "dev_zero_read": lambda v: v is True,
    "dev_urandom_read": lambda v: v == 16,
    "dev_full_enospc": lambda v: v == 28,  # ENOSPC, as /dev/full gives
    "shm_writable": lambda v: v is True,
    "getuser": lambda v: isinstance(v, str) and not v.startswith("ERR"),
    "pwd_entry": lambda v: isinstance(v, str) and not v.startswith("ERR"),
    "grp_entry": lambda v: isinstance(v, str) and not v.startswith("ERR"),
    "home": lambda v: isinstance(v, str) and v.startswith("/") and v != "~",
    "home_writable": lambda v: v is True,
    "tmp_writable": lambda v: v is True,
    "localtime": lambda v: v is True,
    "zoneinfo": lambda v: v == "Europe/Paris",
    "locale": lambda v: isinstance(v, str) and not v.startswith("ERR"),
    "preferred_encoding": lambda v: str(v).upper().replace("-", "") == "UTF8",
    "fs_encoding": lambda v: v == "utf-8",
    "etc_hosts_localhost": lambda v: v == "127.0.0.1",
    "hostname": lambda v: isinstance(v, str) and bool(v) and not v.startswith("ERR"),
    "ssl_certs": lambda v: v is True,
    "mime_types": lambda v: v == "text/csv",
    "pool_fork": lambda v: v == FACTORIALS,
    "pool_spawn": lambda v: v == FACTORIALS,
    "pool_forkserver": lambda v: v == FACTORIALS,
    "mp_lock": lambda v: v is True,
    "shared_memory": lambda v: v is True,
    "subprocess_ls": lambda v: v == 0,
    "threads_32": lambda v: v is True,
}


def probe(kernel) -> dict[str, Any]:
    """Run the probe cell through ``kernel`` (a ``tests.kernels.Kernel``); its results."""
    r = kernel.execute(PROBE, timeout=300)
    assert r.status == "ok", r.reply["content"]
    return json.loads(r.stdout.strip().splitlines()[-1])


def mismatches(seen: dict[str, Any], expected: dict[str, Callable[[Any], bool]] = EXPECTED) -> dict[str, Any]:
    """``{probe: value}`` of every probe whose value is not what a normal machine gives."""
    return {k: seen.get(k, "missing") for k, ok in expected.items() if not ok(seen.get(k))}
