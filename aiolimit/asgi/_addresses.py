"""Client addresses: what a per-client rule counts by.

>>> Rule("api-per-client", "10/second", key=client_ip)
>>> Rule("api-per-client", "10/second", key=client_ip_from(["10.0.0.0/8"]))
"""

from __future__ import annotations

import functools
import ipaddress
import re
from collections.abc import Callable, Iterable, Iterator
from itertools import chain

from .._values import shown
from ..errors import InvalidArgumentError
from ._types import KeyFunc, Scope

__all__ = ["UNKNOWN_CLIENT", "client_ip", "client_ip_from"]

UNKNOWN_CLIENT = "unknown"
DEFAULT_IPV6_PREFIX = 56
"""IPv6 clients are counted by network: one ``/56`` is one budget (as express-rate-limit does),
since one host is handed a ``/64`` or more and could otherwise pick a new address per request."""

_IP = ipaddress.IPv4Address | ipaddress.IPv6Address
_Network = ipaddress.IPv4Network | ipaddress.IPv6Network


def client_ip(scope: Scope) -> str:
    """The peer address of the connection: the key of a per-client rule.

    >>> Rule("api-per-client", "10/second", key=client_ip)

    ``X-Forwarded-For`` is never read (anyone can send it); behind a proxy use
    :func:`client_ip_from`. Every spelling of an address is one key (``2001:DB8::1`` is
    ``2001:db8::1``, ``::ffff:203.0.113.7`` is ``203.0.113.7``), and an IPv6 client counts
    in its ``/56`` network (the key reads ``2001:db8:0:100::/56``); for another prefix use
    ``client_ip_from([], ipv6_prefix=64)``. Connections without a peer address (a Unix
    socket) share one budget, ``"unknown"``, rather than going unlimited.
    """
    return _peer_key(scope, DEFAULT_IPV6_PREFIX)


def client_ip_from(
    trusted_proxies: Iterable[str],
    *,
    header: str = "X-Forwarded-For",
    ipv6_prefix: int = DEFAULT_IPV6_PREFIX,
) -> KeyFunc:
    """A key that reads a forwarding header, but only as far as the proxies you trust wrote it.

    >>> Rule("api-per-client", "10/second", key=client_ip_from(["10.0.0.0/8", "127.0.0.1"]))
    >>> Rule("api-per-client", "10/second", key=client_ip_from(["10.0.0.0/8"], header="Forwarded"))
    >>> Rule("api-per-client", "10/second", key=client_ip_from([], ipv6_prefix=64))  # the peer

    ``header`` is ``"X-Forwarded-For"`` (the default) or ``"Forwarded"`` (RFC 7239, its
    ``for=`` parameters: ``Forwarded: for=192.0.2.60;proto=https, for="[2001:db8::17]:4711"``);
    only the one you name is read, as your proxies are set up to write one of them.

    When the peer is a trusted proxy, the header is read from its right end, skipping the
    addresses of trusted proxies; the first other address is the client (the one the outermost
    trusted proxy saw). Entries a client wrote itself lie further left and are never reached.
    From any other peer the header is ignored and the peer address is the client. Where a
    trusted proxy's entry is no address (``unknown``, an obfuscated name, no ``for=``) or is
    malformed, the nearest address read so far (the last trusted proxy's, else the peer) is
    the client. Elements end at every comma, quoted or not (no ``for=`` value holds one):
    text a client wrote, an unbalanced quote included, never reaches into the proxies'
    elements; a proxy's element with a comma inside a quoted value reads as malformed.

    Addresses are canonical and IPv6 ones grouped by ``ipv6_prefix`` (1 to 128; 128: each
    address alone), as :func:`client_ip` does.
    """
    networks = _networks(trusted_proxies)
    if not isinstance(header, str) or header.lower() not in _FORWARDING_HEADERS:
        raise InvalidArgumentError(
            f"header must be 'X-Forwarded-For' or 'Forwarded', not {shown(header)}"
        )
    if isinstance(ipv6_prefix, bool) or not isinstance(ipv6_prefix, int):
        raise InvalidArgumentError(f"ipv6_prefix must be an int, not {shown(ipv6_prefix)}")
    if not 1 <= ipv6_prefix <= 128:
        raise InvalidArgumentError(f"ipv6_prefix must be 1 to 128, not {ipv6_prefix}")
    field_name = header.lower().encode()
    hops_in = _FORWARDING_HEADERS[header.lower()]

    def trusted(ip: _IP) -> bool:
        return any(ip in network for network in networks)

    def key(scope: Scope) -> str:
        peer = _canonical(_peer(scope))
        if peer is None or not trusted(peer):
            return _peer_key(scope, ipv6_prefix)
        fields = [value for name, value in scope.get("headers", ()) if name.lower() == field_name]
        # from the right, and only as far as needed: what a client wrote is never parsed
        hops = chain.from_iterable(hops_in(value.decode("latin-1")) for value in reversed(fields))
        nearest = peer
        for hop in hops:
            ip = _canonical(hop)
            if ip is None:
                break  # no address where a trusted proxy should have written one
            if not trusted(ip):
                return _key_of(ip, ipv6_prefix)
            nearest = ip
        return _key_of(nearest, ipv6_prefix)

    return key


def _networks(trusted_proxies: Iterable[str]) -> list[_Network]:
    if isinstance(trusted_proxies, str):
        raise InvalidArgumentError(
            f"trusted_proxies must be a list of addresses or networks, not the str "
            f"{trusted_proxies!r} (write [{trusted_proxies!r}])"
        )
    networks: list[_Network] = []
    for proxy in trusted_proxies:
        try:
            network = ipaddress.ip_network(proxy, strict=False)
        except (TypeError, ValueError):
            raise InvalidArgumentError(
                f"trusted_proxies: {proxy!r} is not an IP address or network"
            ) from None
        networks.append(network)
        if isinstance(network, ipaddress.IPv6Network) and network.subnet_of(_V4_MAPPED):
            # ::ffff:10.0.0.0/104 is 10.0.0.0/8: the addresses it holds are read as IPv4
            low_bits = int(network.network_address) & 0xFFFF_FFFF
            networks.append(ipaddress.IPv4Network((low_bits, network.prefixlen - 96)))
    return networks


_V4_MAPPED = ipaddress.IPv6Network("::ffff:0:0/96")


# -- one address, one key -------------------------------------------------------------------------

_CACHED = 4096  # addresses whose parse and key are remembered (a parse takes microseconds)
# "0000:0000:0000:0000:0000:ffff:255.255.255.255" is 45 characters; room for a short zone
_LONGEST_ADDRESS = 64


def _peer(scope: Scope) -> str | None:
    client = scope.get("client")
    if client and client[0]:
        return str(client[0])
    return None


def _peer_key(scope: Scope, ipv6_prefix: int) -> str:
    """The key of the peer: its address's, its text when it is none (a server's own name for
    a connection), ``"unknown"`` without one."""
    peer = _peer(scope)
    if peer and len(peer) <= _LONGEST_ADDRESS:  # (_canonical's test)
        key = _address_key(peer, ipv6_prefix)
        if key is not None:
            return key
    return peer or UNKNOWN_CLIENT


@functools.lru_cache(maxsize=_CACHED)
def _address_key(text: str, ipv6_prefix: int) -> str | None:
    """The key of the address ``text`` spells, None when it is no address: the peer's key
    remembered by its text (once per request: an address hashes in Python, a str in C)."""
    ip = _parsed(text)
    return None if ip is None else _key_of(ip, ipv6_prefix)


def _canonical(text: str | None) -> _IP | None:
    """The address ``text`` spells, IPv4-mapped IPv6 as IPv4, without an IPv6 zone; None
    when it is no address (longer than any address's text, too)."""
    if not text or len(text) > _LONGEST_ADDRESS:
        return None
    return _parsed(text)


@functools.lru_cache(maxsize=_CACHED)
def _parsed(text: str) -> _IP | None:
    try:
        ip = ipaddress.ip_address(text)
    except ValueError:
        return None
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return ip.ipv4_mapped
        if ip.scope_id is not None:
            return ipaddress.IPv6Address(int(ip))
    return ip


@functools.lru_cache(maxsize=_CACHED)
def _key_of(ip: _IP, ipv6_prefix: int) -> str:
    """``203.0.113.7``; ``2001:db8:0:100::/56`` for an IPv6 address (the address itself at 128)."""
    if isinstance(ip, ipaddress.IPv4Address) or ipv6_prefix == 128:
        return str(ip)
    host_bits = 128 - ipv6_prefix
    return f"{ipaddress.IPv6Address(int(ip) >> host_bits << host_bits)}/{ipv6_prefix}"


# -- forwarding headers ---------------------------------------------------------------------------
# A hop is the text of one address as a proxy wrote it, or None where an element is malformed
# or names no address a proxy could have connected from.


def _x_forwarded_for(value: str) -> Iterator[str | None]:
    """The hops of one ``X-Forwarded-For`` field, rightmost first (empty entries skipped)."""
    hops = (hop.strip(" \t") for hop in reversed(value.split(",")))
    return (hop for hop in hops if hop)


_TOKEN = r"[!#$%&'*+.^_`|~0-9A-Za-z-]+"
_QUOTED = r'"(?:[\t !#-\[\]-~\x80-\xff]|\\[\t !-~\x80-\xff])*"'
# One optional forwarded-pair of RFC 7239 with the whitespace around it, up to ";" or the end.
_PAIR = re.compile(rf"[ \t]*(?:({_TOKEN})=({_TOKEN}|{_QUOTED})[ \t]*)?")
_ESCAPE = re.compile(r"\\(.)")


def _forwarded(value: str) -> Iterator[str | None]:
    """The ``for=`` node of each element of one RFC 7239 ``Forwarded`` field, rightmost first
    (empty elements skipped): the address without port or brackets, else the node as
    written (``unknown``, ``_hidden``), None for an element that is malformed or has no
    ``for=``. Elements end at every comma (see :func:`client_ip_from`)."""
    elements = reversed(value.split(","))
    return (_for_node(element) for element in elements if element.strip(" \t"))


def _for_node(element: str) -> str | None:
    node: str | None = None
    seen: set[str] = set()
    at = 0
    while True:
        pair = _PAIR.match(element, at)  # always matches: every part of it is optional
        if pair is None:
            return None
        name, raw = pair.group(1, 2)
        if name is not None:
            if name.lower() in seen:
                return None  # a parameter twice in one element (RFC 7239 section 4)
            seen.add(name.lower())
            if name.lower() == "for":
                node = _ESCAPE.sub(r"\1", raw[1:-1]) if raw.startswith('"') else raw
        at = pair.end()
        if at == len(element):
            return None if node is None else _node_address(node)
        if element[at] != ";":
            return None  # malformed: an unbalanced quote, a stray character
        at += 1


# RFC 7239 section 6: node = nodename [ ":" node-port ]; an IPv6 nodename is in brackets.
_NODE = re.compile(r"(\[[^\]]*\]|[^:\[\]]*)(?::(?:[0-9]{1,5}|_[A-Za-z0-9._-]+))?")


def _node_address(node: str) -> str | None:
    """``[2001:db8::17]:4711`` -> ``2001:db8::17``, ``192.0.2.43:47011`` -> ``192.0.2.43``,
    ``unknown`` and ``_hidden`` as they are; None for what is no node."""
    parsed = _NODE.fullmatch(node)
    if parsed is None:
        return None
    name = parsed.group(1)
    return name[1:-1] if name.startswith("[") else name


_FORWARDING_HEADERS: dict[str, Callable[[str], Iterator[str | None]]] = {
    "x-forwarded-for": _x_forwarded_for,
    "forwarded": _forwarded,
}
