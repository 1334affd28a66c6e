"""Client addresses: what a per-client rule counts by.

>>> Rule("api-per-client", "10/second", key=client_ip)
>>> Rule("api-per-client", "10/second", key=client_ip_from(["10.0.0.0/8"]))
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Callable, Iterable

from .._types import shown
from ..errors import InvalidArgumentError
from ._types import KeyFunc, Scope

__all__ = ["UNKNOWN_CLIENT", "client_ip", "client_ip_from"]

UNKNOWN_CLIENT = "unknown"


def client_ip(scope: Scope) -> str:
    """The peer address of the connection: the key of a per-client rule.

    >>> Rule("api-per-client", "10/second", key=client_ip)

    ``X-Forwarded-For`` is never read (anyone can send it); behind a proxy use
    :func:`client_ip_from`. Connections without a peer address (a Unix socket) share one
    budget, ``"unknown"``, rather than going unlimited.
    """
    client = scope.get("client")
    if client and client[0]:
        return str(client[0])
    return UNKNOWN_CLIENT


_Network = ipaddress.IPv4Network | ipaddress.IPv6Network


def client_ip_from(trusted_proxies: Iterable[str], *, header: str = "X-Forwarded-For") -> KeyFunc:
    """A key that reads a forwarding header, but only as far as the proxies you trust wrote it.

    >>> Rule("api-per-client", "10/second", key=client_ip_from(["10.0.0.0/8", "127.0.0.1"]))
    >>> Rule("api-per-client", "10/second", key=client_ip_from(["10.0.0.0/8"], header="Forwarded"))

    ``header`` is ``"X-Forwarded-For"`` (the default) or ``"Forwarded"`` (RFC 7239, its
    ``for=`` parameters: ``Forwarded: for=192.0.2.60;proto=https, for="[2001:db8::17]:4711"``);
    only the one you name is read, as your proxies are set up to write one of them.

    When the peer is a trusted proxy, the header is read from its right end, skipping the
    addresses of trusted proxies; the first other address is the client (the one the outermost
    trusted proxy saw). Entries a client wrote itself lie further left and are never reached.
    From any other peer the header is ignored and the peer address is the client. Where a
    trusted proxy wrote something that is no address (``unknown``, an obfuscated name,
    garbage), the nearest address read so far is the client.
    """
    if isinstance(trusted_proxies, str):
        raise InvalidArgumentError(
            f"trusted_proxies must be a list of addresses or networks, not the str "
            f"{trusted_proxies!r} (write [{trusted_proxies!r}])"
        )
    networks: list[_Network] = []
    for proxy in trusted_proxies:
        try:
            networks.append(ipaddress.ip_network(proxy, strict=False))
        except (TypeError, ValueError):
            raise InvalidArgumentError(
                f"trusted_proxies: {proxy!r} is not an IP address or network"
            ) from None
    if not isinstance(header, str) or header.lower() not in _FORWARDING_HEADERS:
        raise InvalidArgumentError(
            f"header must be 'X-Forwarded-For' or 'Forwarded', not {shown(header)}"
        )
    field_name = header.lower().encode()
    hops_in = _FORWARDING_HEADERS[header.lower()]

    def trusted(address: str) -> bool:
        try:
            ip = ipaddress.ip_address(address)
        except ValueError:
            return False
        return any(ip in network for network in networks)

    def key(scope: Scope) -> str:
        peer = client_ip(scope)
        if not trusted(peer):
            return peer
        hops: list[str] = [
            hop
            for name, value in scope.get("headers", ())
            if name.lower() == field_name
            for hop in hops_in(value.decode("latin-1"))
        ]
        nearest = peer
        for hop in reversed(hops):
            if not _is_ip(hop):
                return nearest  # not an address where a trusted proxy should have written one
            if not trusted(hop):
                return hop
            nearest = hop
        return nearest

    return key


def _x_forwarded_for(value: str) -> list[str]:
    """The hops of one ``X-Forwarded-For`` field, leftmost first."""
    return [hop.strip() for hop in value.split(",")]


def _forwarded(value: str) -> list[str]:
    """The ``for=`` node of each element of one RFC 7239 ``Forwarded`` field, leftmost first:
    an address without its port or brackets, or the text as written when it is none
    (``unknown``, ``_hidden``); ``""`` for an element without ``for=``."""
    hops = []
    for element in _split_outside_quotes(value, ","):
        node = ""
        for pair in _split_outside_quotes(element, ";"):
            name, equals, raw = pair.partition("=")
            if equals and name.strip().lower() == "for":
                node = _node_address(_unquoted(raw.strip()))
        hops.append(node)
    return hops


def _split_outside_quotes(text: str, separator: str) -> list[str]:
    parts, start, quoted, escaped = [], 0, False, False
    for i, char in enumerate(text):
        if escaped:
            escaped = False
        elif quoted and char == "\\":
            escaped = True
        elif char == '"':
            quoted = not quoted
        elif char == separator and not quoted:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return parts


def _unquoted(text: str) -> str:
    if len(text) >= 2 and text[0] == text[-1] == '"':
        return re.sub(r"\\(.)", r"\1", text[1:-1])
    return text


def _node_address(node: str) -> str:
    """``[2001:db8::17]:4711`` -> ``2001:db8::17``, ``192.0.2.43:47011`` -> ``192.0.2.43``."""
    if node.startswith("["):
        address, bracket, _ = node[1:].partition("]")
        return address if bracket else node
    address, colon, port = node.partition(":")
    return address if colon and port.isdigit() and "." in address else node


_FORWARDING_HEADERS: dict[str, Callable[[str], list[str]]] = {
    "x-forwarded-for": _x_forwarded_for,
    "forwarded": _forwarded,
}


def _is_ip(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True
