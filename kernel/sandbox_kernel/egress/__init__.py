"""Egress by domain (``network=allowlist``): the decision, its record, the local proxy.

* :mod:`.rules`: what may be reached, decided on the host from the policy
  (names, wildcards, ports, the operator's override map, the address a name
  resolves to); pure apart from the resolver it is given.
* :mod:`.record`: every attempt (time, cell, host, port, bytes, verdict), kept
  recent for ``kernel_info["sandbox"]["egress"]``, logged, and told to the
  kernel so that a denial shows in the cell that made it.
* :mod:`.server`: the filtering HTTP proxy one local kernel serves its sandbox
  on a unix socket (``CONNECT`` and absolute-URI HTTP only).

The in-sandbox end (a TCP listener on the sandbox's own loopback forwarding
each connection to that socket) is the agent's (``guest/agent/egress.py``,
``EgressForwarder``).  Cloud backends map the same policy onto their
provider's own egress controls (``backends/e2b.py``, ``backends/modal.py``).
"""
