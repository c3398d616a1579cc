"""Which addresses a notification may be sent to: the broker connects to a
team's webhook or SMTP server from inside its own network, so a target on
its host, in its private network or at a cloud's metadata service is
refused (SSRF) unless the operator lists its network
(SPOTBROKER_NOTIFY_ALLOWED_NETWORKS). Checked when a budget is set and
again, on every address the name resolves to, when a message is sent
(broker/money/notify.py).

An IPv6 address can carry an IPv4 one, and reach it: mapped
(`::ffff:a.b.c.d`), translated (`::ffff:0:a.b.c.d`), IPv4-compatible
(`::a.b.c.d`), NAT64 (`64:ff9b::a.b.c.d`) and 6to4 (`2002:AABB:CCDD::`).
Python calls most of them global whatever they carry, so each is judged by
the IPv4 address inside it. Site-local (`fec0::/10`, deprecated but still
routed by some stacks) and the local-use NAT64 prefix (`64:ff9b:1::/48`,
whose embedding varies) are refused outright.
"""
from __future__ import annotations

import ipaddress
import socket
from collections.abc import Iterable

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
# Names that reach the broker's own host or a cloud's metadata service without DNS.
_INTERNAL_NAMES = ("localhost", "localhost.localdomain", "metadata", "metadata.google.internal",
                   "metadata.goog", "instance-data", "instance-data.ec2.internal")
_LAST_32_BITS = tuple(ipaddress.ip_network(n) for n in (
    "::ffff:0:0/96",      # IPv4-mapped
    "::ffff:0:0:0/96",    # IPv4-translated (SIIT)
    "64:ff9b::/96",       # NAT64, well-known prefix
    "::/96",              # IPv4-compatible (deprecated); :: and ::1 are judged as themselves
))
_SIXTOFOUR = ipaddress.ip_network("2002::/16")
_NEVER = tuple(ipaddress.ip_network(n) for n in ("fec0::/10", "64:ff9b:1::/48"))


def literal_address(host: str) -> Address | None:
    """The address a host names by itself, in any spelling a resolver takes
    (127.1, 0x7f.0.0.1, 2130706433, [::ffff:127.0.0.1]); None for a name."""
    try:
        address = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        try:
            address = ipaddress.ip_address(socket.inet_aton(host))
        except OSError:
            return None
    mapped = getattr(address, "ipv4_mapped", None)
    return mapped or address


def embedded_ipv4(address: Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 one carries (see the module's docstring), or None."""
    if address.version != 6 or address in (ipaddress.IPv6Address("::"), ipaddress.IPv6Address("::1")):
        return None
    if address in _SIXTOFOUR:
        return address.sixtofour
    if any(address in net for net in _LAST_32_BITS):
        return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    return None


def address_problem(address: Address, allowed: Iterable[str]) -> str | None:
    """Why a notification may not be sent to `address`, or None. The broker
    is the one connecting: a target on its own host, in its network or at a
    cloud's metadata service would have it reach what the admin's browser
    cannot (SSRF); the operator lists the networks it may reach
    (SPOTBROKER_NOTIFY_ALLOWED_NETWORKS)."""
    networks = [ipaddress.ip_network(n, strict=False) for n in allowed]
    inner = embedded_ipv4(address)
    if any(a in net for a in (address, inner) if a is not None for net in networks if a.version == net.version):
        return None
    if any(address in net for net in _NEVER):
        return (f"{address} is a site-local or local-use NAT64 address; the broker sends only to public "
                "addresses unless SPOTBROKER_NOTIFY_ALLOWED_NETWORKS lists its network")
    for a in (address, inner):
        if a is not None and (not a.is_global or a.is_multicast):
            carried = f" (it carries {a})" if a is inner else ""
            return (f"{address}{carried} is a private, loopback, link-local or reserved address; the broker "
                    "sends only to public addresses unless SPOTBROKER_NOTIFY_ALLOWED_NETWORKS lists its network")
    return None


def host_problem(host: str, allowed: Iterable[str]) -> str | None:
    """Why a target's host is refused before any DNS: an internal name, or
    a literal address `address_problem` refuses."""
    allowed = list(allowed)
    name = host.lower().rstrip(".")
    address = literal_address(name)
    if address is not None:
        return address_problem(address, allowed)
    if name in _INTERNAL_NAMES or name.endswith((".localhost", ".internal")):
        if allowed:
            return None  # the operator allows internal networks: the name resolves into one of them or is refused then
        return (f"{host} names the broker's host or a cloud's internal service; the broker sends only to "
                "public addresses unless SPOTBROKER_NOTIFY_ALLOWED_NETWORKS lists its network")
    return None
