"""The egress decision: may the sandbox reach ``host:port``, and at which address.

Everything is decided on the host from the policy (``Policy.network``,
``allow_domains``, ``allow_ports``, ``egress_resolve``), never from what the
sandbox claims beyond the name and port it asks for:

1. the port must be in ``allow_ports``;
2. an IP literal is refused unless the operator listed that very literal in
   ``allow_domains`` (and it is public) or mapped it in ``egress_resolve``;
3. a name must match ``allow_domains`` (``*.example.org`` matches every name
   *below* example.org, not example.org itself);
4. a name in ``egress_resolve`` goes where the operator said, whatever the
   address (the one way to a loopback or private address);
5. any other name is resolved on the host, and refused if *any* answer is not
   a public address (loopback, private, link-local with the cloud metadata
   address 169.254.169.254, multicast, reserved, unspecified, shared): a name
   that resolves to such an address is DNS rebinding.  The proxy then connects
   to the address checked, never resolving again.

This module imports nothing of the package (``policy.py`` calls
:func:`check_egress_options`); the resolver is passed in, so tests decide
without sending a packet.
"""

from __future__ import annotations

import ipaddress
import re
import socket
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any

#: An async resolver: host name -> the IP addresses it names (strings).
Resolver = Callable[[str], Awaitable[list[str]]]

_LABEL = re.compile(r"^(?!-)[a-z0-9_-]{1,63}(?<!-)$")
IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


def normalize_host(host: str) -> str:
    """``host`` as compared: lower case, no trailing dot, IPv6 without brackets."""
    h = host.strip().lower().rstrip(".")
    if h.startswith("[") and h.endswith("]"):
        h = h[1:-1]
    return h


def ip_literal(host: str) -> IPAddress | None:
    """The address ``host`` spells, or None for a name (after :func:`normalize_host`)."""
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        return None


def is_host_name(host: str) -> bool:
    """A DNS name of letters, digits, ``-`` and ``_``, not all-numeric (``2130706433`` and
    ``0x7f.1`` are addresses to some resolvers, so they are refused as names)."""
    labels = host.split(".")
    if len(host) > 253 or not all(_LABEL.match(lab) for lab in labels):
        return False
    return not re.fullmatch(r"[0-9x.]+", host)


def non_public(ip: IPAddress) -> str | None:
    """Why ``ip`` is not a public address (``"loopback"``, ``"private"``,
    ``"link-local"``...), or None for a public one; an IPv4-mapped IPv6 address is
    judged as its IPv4 address."""
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    for kind in ("loopback", "link_local", "multicast", "unspecified", "reserved", "private"):
        if getattr(ip, f"is_{kind}"):
            return kind.replace("_", "-")
    if not ip.is_global:
        return "non-global"
    return None


def split_resolve(value: str) -> tuple[str, int | None]:
    """An ``egress_resolve`` value, ``IP`` or ``IP:PORT`` (``[v6]:PORT``), as (ip, port).

    Raises
    ------
    ValueError
        If it is neither.
    """
    v = value.strip()
    port: int | None = None
    if v.startswith("["):
        addr, _, rest = v[1:].partition("]")
        if rest:
            if not rest.startswith(":"):
                raise ValueError(value)
            port = int(rest[1:])
    elif v.count(":") == 1:
        addr, p = v.split(":")
        port = int(p)
    else:
        addr = v
    ipaddress.ip_address(addr)
    if port is not None and not 0 < port < 65536:
        raise ValueError(value)
    return addr, port


def check_egress_options(policy: Any) -> None:
    """The rules of ``allow_domains``, ``allow_ports`` and ``egress_resolve``
    (called by ``Policy.validate``).

    Raises
    ------
    PolicyError
        Naming the field and the bad entry.
    """
    from ..errors import PolicyError

    for d in policy.allow_domains:
        h = normalize_host(d)
        ok = is_host_name(h[2:]) if h.startswith("*.") else (ip_literal(h) is not None or is_host_name(h))
        if not ok:
            raise PolicyError("allow_domains", d, "must be a host name, '*.' and a domain, or an IP literal")
    for p in policy.allow_ports:
        if not 0 < p < 65536:
            raise PolicyError("allow_ports", p, "must be a TCP port (1 to 65535)")
    for name, value in policy.egress_resolve:
        if not is_host_name(normalize_host(name)) and ip_literal(normalize_host(name)) is None:
            raise PolicyError("egress_resolve", name, "keys must be host names")
        try:
            split_resolve(value)
        except ValueError:
            raise PolicyError("egress_resolve", f"{name}={value}", "values must be IP or IP:PORT "
                              "([v6]:PORT)") from None


def cloud_allowlist(policy: Any) -> tuple[list[str], list[str]] | None:
    """What a cloud provider's egress allowlist gets from ``policy``: (names and
    wildcards, public IP literals), normalised, or None when nothing may be reached
    (``network="none"``, or nothing usable listed).  Non-public literals are dropped:
    only ``egress_resolve`` may lead there, and the providers have none."""
    if policy.network == "none":
        return None
    names, literals = [], []
    for d in policy.allow_domains:
        h = normalize_host(d)
        ip = ip_literal(h)
        if ip is None:
            names.append(h)
        elif non_public(ip) is None:
            literals.append(h)
    return (names, literals) if names or literals else None


@dataclass(frozen=True)
class Decision:
    """The verdict on one attempt.

    Attributes
    ----------
    host : str
        The name (or literal) asked for, normalised.
    port : int
        The port asked for.
    allowed : bool
    reason : str
        Denied: the rule, as the end of ``egress denied: host:port <reason>``.
        Allowed: how the address was found (``"dns"``, ``"egress_resolve"``, ``"literal"``).
    address : tuple of (str, int) or None
        Allowed: where the proxy connects (the checked address, and the port,
        which ``egress_resolve`` may change).
    """

    host: str
    port: int
    allowed: bool
    reason: str
    address: tuple[str, int] | None = None

    @property
    def line(self) -> str:
        """The one line a denied cell shows: ``egress denied: example.com:443 is not in
        allow_domains``."""
        shown = f"[{self.host}]" if ":" in self.host else self.host
        return f"egress denied: {shown}:{self.port} {self.reason}"


async def host_resolver(host: str) -> list[str]:
    """Resolve ``host`` on the host (the proxy's own resolver), TCP addresses only.

    Raises
    ------
    OSError
        ``socket.gaierror`` when the name does not resolve.
    """
    import asyncio

    infos = await asyncio.get_running_loop().getaddrinfo(host, None, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(str(i[4][0]) for i in infos))


class EgressRules:
    """The allowlist of one policy, ready to decide.

    Parameters
    ----------
    allow_domains : iterable of str
        Names, ``*.domain`` wildcards and IP literals.
    allow_ports : iterable of int
    resolve : iterable of (str, str)
        The operator's override map (``egress_resolve``): name -> ``IP`` or ``IP:PORT``.
    resolver : callable, optional
        Async name -> addresses; default :func:`host_resolver`.  Tests pass a stub.
    """

    def __init__(self, allow_domains: Iterable[str], allow_ports: Iterable[int],
                 resolve: Iterable[tuple[str, str]] = (), resolver: Resolver | None = None):
        names = [normalize_host(d) for d in allow_domains]
        self.exact = frozenset(n for n in names if not n.startswith("*."))
        self.suffixes = tuple(n[1:] for n in names if n.startswith("*."))  # ".example.org"
        self.ports = frozenset(allow_ports)
        self.resolve = {normalize_host(k): split_resolve(v) for k, v in resolve}
        self.resolver = resolver or host_resolver

    @classmethod
    def from_policy(cls, policy: Any, resolver: Resolver | None = None) -> EgressRules:
        """The rules of a :class:`~sandbox_kernel.policy.Policy`."""
        return cls(policy.allow_domains, policy.allow_ports, policy.egress_resolve, resolver)

    def name_allowed(self, host: str) -> bool:
        """``host`` (normalised) is in ``allow_domains`` or below one of its wildcards."""
        return host in self.exact or any(host.endswith(s) for s in self.suffixes)

    async def decide(self, host: str, port: int) -> Decision:
        """Decide on ``host:port``; resolves names on the host (never the literals).

        Returns
        -------
        Decision
            Never raises for bad input: an unusable host or port is a denial.
        """
        h = normalize_host(host)

        def deny(reason: str) -> Decision:
            return Decision(h, port, False, reason)

        if not 0 < port < 65536:
            return deny("is not a valid port")
        if port not in self.ports:
            return deny(f"uses port {port}, not in allow_ports ({', '.join(map(str, sorted(self.ports)))})")
        literal = ip_literal(h)
        if h in self.resolve:  # the operator's decision: any address, and allowed names only
            if literal is None and not self.name_allowed(h):
                return deny("is not in allow_domains")
            addr, over = self.resolve[h]
            return Decision(h, port, True, "egress_resolve", (addr, over or port))
        if literal is not None:
            why = non_public(literal)
            if h not in self.exact:
                return deny("is an IP literal the operator did not allow (allow_domains names hosts)")
            if why:
                return deny(f"is a {why} address; only egress_resolve may lead there")
            return Decision(h, port, True, "literal", (h, port))
        if not is_host_name(h):
            return deny("is not a valid host name")
        if not self.name_allowed(h):
            return deny("is not in allow_domains")
        try:
            answers = await self.resolver(h)
        except OSError as err:
            return deny(f"does not resolve on the host ({err.strerror or err})")
        if not answers:
            return deny("does not resolve on the host")
        for a in answers:
            ip = ip_literal(a.split("%")[0])
            why = non_public(ip) if ip is not None else "unparsable"
            if why:
                return deny(f"resolves to {a}, a {why} address; only egress_resolve may lead there")
        return Decision(h, port, True, "dns", (answers[0], port))
