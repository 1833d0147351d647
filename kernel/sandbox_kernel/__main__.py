"""``python -m sandbox_kernel -f {connection_file}``: launch the proxy kernel.

Before the proxy's imports (ipykernel, jupyter_client, zmq: 0.3-0.9 s), its first
sandbox is started in a thread where it may be (:mod:`.backends.local.early`); a spare
proxy (:mod:`.prestart`, :data:`~.prestart.HANDOVER_FD_ENV` set) has done its imports
and starts its sandbox once handed a kernel.
"""

import os
import sys

if __name__ == "__main__":
    if "SANDBOX_KERNEL_HANDOVER_FD" not in os.environ:  # prestart.HANDOVER_FD_ENV (tests/test_early.py)
        from sandbox_kernel.backends.local import early

        early.begin(sys.argv[1:])
    from sandbox_kernel.app import main

    main()
