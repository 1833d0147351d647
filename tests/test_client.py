"""The agent client (``sandbox_kernel.Sandbox`` / ``AsyncSandbox``) on real sandboxed kernels.

One kernel per local runtime for the module (gVisor, bubblewrap), started
through the installed test kernelspecs; every cell runs inside the sandbox.
"""

from __future__ import annotations

import asyncio
import json

import pytest
from client_flow import files_flow, quickstart_flow
from kernels import RUNTIMES, kernel_name_for
from sandbox_kernel import AsyncSandbox, Sandbox
from sandbox_kernel.client import Execution, ExecutionError, Result
from sandbox_kernel.client.execution import Collector


@pytest.fixture(scope="module", params=RUNTIMES)
def sbx(request, kernelspec_prefix):
    with Sandbox(kernel_name_for(request.param)) as s:
        yield s


def test_quickstart_flow(sbx):
    quickstart_flow(sbx)


def test_info_names_backend_boundary_limits_egress(sbx):
    info = sbx.info()
    assert info.backend == "local" and info.state == "running", info
    assert info.boundary and info.raw["runtime"] in RUNTIMES
    assert info.limits["memory_mib"] > 0 and "cell_timeout_s" in info.limits
    assert info.egress == "none"


def test_an_execution_says_what_the_cell_cost_against_the_limits(sbx):
    ex = sbx.run("import time\nt = time.process_time()\nwhile time.process_time() - t < 0.5: pass")
    assert ex.ok and ex.usage["measured"] is True, ex.usage
    assert ex.usage["memory_limit_bytes"] == sbx.info().limits["memory_mib"] * 2**20
    # The guest's own clock and the host's cgroup disagree under load (gVisor: 0.5 s in the guest,
    # 0.45 s charged on the host); half of it is far above an idle cell's ~0.01 s.
    assert ex.usage["cpu_s"] >= 0.25 and 0 < ex.usage["memory_bytes"] <= ex.usage["memory_peak_bytes"], ex.usage


def test_streams_callbacks_and_display_order(sbx):
    seen: list[tuple[str, object]] = []
    ex = sbx.run("import sys\nprint('out'); print('err', file=sys.stderr)\n"
                 "from IPython.display import display, HTML\ndisplay(HTML('<b>a</b>')); 5",
                 on_stdout=lambda t: seen.append(("out", t)), on_stderr=lambda t: seen.append(("err", t)),
                 on_result=lambda r: seen.append(("res", r.formats)))
    assert ex.stdout == "out\n" and ex.stderr == "err\n"
    assert [r.is_main_result for r in ex.results] == [False, True]
    assert ex.results[0].html == "<b>a</b>" and ex.text == "5"
    assert ("out", "out\n") in seen and ("err", "err\n") in seen
    assert [s for s in seen if s[0] == "res"] == [("res", ["text/plain", "text/html"]), ("res", ["text/plain"])]
    assert ex.duration_s > 0


def test_input_answered_by_callback_else_clear_error(sbx):
    ex = sbx.run("print(input('name? '))", on_input=lambda prompt, password: f"Ada<{prompt}>")
    assert ex.stdout == "Ada<name? >\n", ex
    ex = sbx.run("input('name? ')")
    assert ex.error.ename == "StdinNotImplementedError" and "on_input=" in ex.error.evalue


def test_interrupt_from_another_thread_keeps_state(sbx):
    import threading

    sbx.run("y = 7")
    timer = threading.Timer(1.0, sbx.interrupt)
    timer.start()
    ex = sbx.run("import time\nwhile True: time.sleep(0.1)", timeout=60)
    timer.join()
    assert ex.error.ename == "KeyboardInterrupt" and not ex.error.timed_out, ex.error
    assert sbx.run("y").text == "7"


def test_files_through_the_file_comm(sbx, tmp_path):
    files_flow(sbx, tmp_path)


def test_restart_loses_state_and_keeps_working(kernelspec_prefix):
    with Sandbox(kernel_name_for("bubblewrap")) as s:
        s.run("z = 3")
        s.restart()
        assert s.run("z").error.ename == "NameError"
        assert s.run("z = 4; z").text == "4"


def test_async_twin_and_connection_file(kernelspec_prefix):
    async def main() -> None:
        async with AsyncSandbox(kernel_name_for("bubblewrap")) as owner:
            assert (await owner.run("w = 11")).ok
            cf = owner.transport.km.connection_file
            # a second client on the same kernel, by its connection file: sees the state
            guest = await AsyncSandbox(connection_file=cf).start()
            assert (await guest.run("w * 2")).text == "22"
            job = await guest.submit("import time; time.sleep(30)")
            assert not await job.wait(timeout_s=0.5) and not job.done()
            await guest.interrupt()
            assert await job.wait(timeout_s=30) and job.execution.error.ename == "KeyboardInterrupt"
            with pytest.raises(RuntimeError, match="did not start"):
                await guest.restart()
            await guest.close()  # only disconnects
            assert (await owner.run("w")).text == "11"

    asyncio.run(main())


# ---- the pure part: messages -> Execution --------------------------------------------


def _msg(msg_type: str, **content) -> dict:
    return {"msg_type": msg_type, "content": content}


def test_collector_builds_an_execution_from_messages():
    ex = Execution()
    c = Collector(ex)
    c.apply(_msg("stream", name="stdout", text="a"))
    c.apply(_msg("display_data", data={"text/plain": "d", "image/png": "iVBORw0KGgo="}, metadata={},
                 transient={"display_id": "x"}))
    c.apply(_msg("update_display_data", data={"text/plain": "d2"}, metadata={}, transient={"display_id": "x"}))
    c.apply(_msg("execute_result", data={"text/plain": ["4", "2"]}, metadata={}, execution_count=3))
    c.apply(_msg("error", ename="E", evalue="v", traceback=["\x1b[31mE\x1b[0m: v"]))
    c.apply(_msg("something_new"))  # unknown types are ignored
    c.apply(_msg("status", execution_state="idle"))
    c.apply_reply({"status": "error", "execution_count": 3})
    assert ex.stdout == "a" and ex.execution_count == 3 and c.idle
    assert ex.results[0].text == "d2" and ex.results[1].text == "42" and ex.text == "42"
    assert ex.error == ExecutionError("E", "v", ["E: v"], ["\x1b[31mE\x1b[0m: v"])
    assert Result({"image/png": "iVBORw0KGgo="}).png == b"\x89PNG\r\n\x1a\n"
    assert json.loads(json.dumps(ex.results[0].data))  # bundles stay plain JSON


def test_the_scripted_agent_loop_demo(kernelspec_prefix):
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).parent.parent / "notebooks" / "agent_loop.py"
    r = subprocess.run([sys.executable, str(script), "--kernel", kernel_name_for("bubblewrap")],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr[-2000:]
    assert "figure:" in r.stdout and "fixed: result:" in r.stdout and "TimeoutError" in r.stdout
