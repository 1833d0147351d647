"""Limits hold and every failure is told to the user (issue 3; case C03), on both runtimes."""

import pytest


@pytest.fixture
def limited(install_kernelspec, start_kernel, runtime):
    name = install_kernelspec(runtime, "limited", memory_mib=512, pids_max=200, scratch_mib=64,
                              max_output_bytes_per_cell=200_000)
    return start_kernel(name)


def test_c03_allocation_beyond_the_memory_limit(limited, runtime):
    assert limited.execute("a = 1").status == "ok"
    r = limited.execute("b = bytearray(64 * 1024**3)")
    assert r.status == "error"
    if r.ename == "MemoryError":  # bubblewrap: the address-space rlimit refuses it cleanly
        assert "512 MiB" in r.stderr
        assert limited.execute("a").result_text == "1"
    else:  # gVisor: the breach ends the sandbox; the user is told, state is gone
        assert r.ename == "SandboxRestarted"
        assert "memory limit 512 MiB exceeded" in r.reply["content"]["evalue"]
        assert "restarted" in r.reply["content"]["evalue"]
        assert limited.execute("a").ename == "NameError"


def test_c03_slow_leak_names_the_limit_and_restarts(limited):
    limited.execute("a = 1")
    r = limited.execute("l = []\nwhile True: l.append(bytearray(16 * 1024**2))", timeout=180)
    assert r.ename == "SandboxRestarted"
    evalue = r.reply["content"]["evalue"]
    assert "memory limit 512 MiB exceeded" in evalue and "restarted" in evalue
    assert r.of_type("error")[0]["content"]["ename"] == "SandboxRestarted"
    assert limited.execute("a").ename == "NameError"
    assert limited.execute("1 + 1").result_text == "2"


@pytest.mark.parametrize("code, cause", [
    ("import os; os._exit(1)", "exit code 1"),
    ("import os, signal; os.kill(os.getpid(), signal.SIGKILL)", "signal SIGKILL"),
])
def test_c03_interpreter_exit_is_explained(kernel, code, cause):
    kernel.execute("a = 1")
    r = kernel.execute(code)
    assert r.ename == "SandboxRestarted" and cause in r.reply["content"]["evalue"]
    assert r.statuses == ["busy", "idle"]
    assert kernel.execute("a").ename == "NameError"


def test_fork_bomb_hits_the_process_limit_and_the_kernel_survives(install_kernelspec, start_kernel, runtime):
    # default memory: 200 forked interpreters need more than the 512 MiB of `limited`
    forky = start_kernel(install_kernelspec(runtime, "forky", pids_max=200))
    forky.execute("a = 1")
    r = forky.execute(
        "import os, time\n"
        "kids = []\n"
        "try:\n"
        "    while len(kids) < 5000:\n"
        "        pid = os.fork()\n"
        "        if pid == 0:\n"
        "            time.sleep(60); os._exit(0)\n"
        "        kids.append(pid)\n"
        "except OSError as e:\n"
        "    print('refused after', len(kids), type(e).__name__)\n"
        "for pid in kids:\n"
        "    os.kill(pid, 9); os.waitpid(pid, 0)\n",
        timeout=180,
    )
    if r.status == "ok":  # the process limit refused the fork; the kernel survived
        refused = r.stdout.split()
        assert refused[:2] == ["refused", "after"] and int(refused[2]) < 200
        assert forky.execute("a").result_text == "1"
    else:  # gVisor: ~8 host tasks and their memory per guest process end the sandbox first
        assert r.ename == "SandboxRestarted" and "restarted" in r.reply["content"]["evalue"]
        assert forky.execute("a").ename == "NameError"
    assert forky.execute("1 + 1").result_text == "2"


def test_full_scratch_disk_is_an_oserror_in_the_cell(limited):
    r = limited.execute("open('big.bin', 'wb').write(b'x' * 100 * 1024**2)")
    assert r.status == "error" and r.ename == "OSError"
    assert "No space left on device" in r.reply["content"]["evalue"]
    assert limited.execute("import os; os.remove('big.bin'); 'ok'").result_text == "'ok'"


def test_output_flood_is_cut_with_a_notice_and_the_next_cell_is_unaffected(limited):
    r = limited.execute("for i in range(200000): print('line', i)", timeout=180)
    assert r.status == "ok"
    assert len(r.stdout) <= 200_000
    assert r.stdout.startswith("line 0\nline 1\n")
    assert "output limit reached; dropped" in r.stderr
    after = limited.execute("print('fine')")
    assert after.stdout == "fine\n" and after.stderr == ""
