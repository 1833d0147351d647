"""Cells shared by the tests of copies of a kernel (fork, rewind; local, service, E2B).

:data:`LISTENER` opens a TCP listener on the sandbox's own loopback, served by a thread;
:data:`ASK_UNDER_LOAD` then connects to it 32 times at once from 8 threads, in the same
kernel or in a copy of it, and prints how many answers came back and whose pid they name
(a copy keeps the interpreter's pid: the same process, restored).  Loopback inside the
sandbox only: nothing leaves it.
"""

LISTENER = ("import os, socket, threading\n"
            "srv = socket.socket(); srv.bind(('127.0.0.1', 0)); srv.listen(64)\n"
            "port = srv.getsockname()[1]\n"
            "def _serve():\n"
            "    while True:\n"
            "        c, _ = srv.accept()\n"
            "        with c:\n"
            "            c.sendall(b'pong %d' % os.getpid())\n"
            "threading.Thread(target=_serve, daemon=True).start()")

ASK_UNDER_LOAD = ("from concurrent.futures import ThreadPoolExecutor\n"
                  "def _ask(_):\n"
                  "    with socket.create_connection(('127.0.0.1', port), timeout=10) as s:\n"
                  "        return s.recv(64).decode()\n"
                  "with ThreadPoolExecutor(8) as ex:\n"
                  "    answers = list(ex.map(_ask, range(32)))\n"
                  "print(len(answers), set(answers) == {f'pong {os.getpid()}'})")

#: What :data:`ASK_UNDER_LOAD` prints when every connection was answered.
ALL_ANSWERED = "32 True\n"
