"""The client's address behind trusted proxies (``MT_TRUSTED_PROXIES``).

Rate limits, DeepL's monthly counts and the request log name a client by its address. Behind
a load balancer or an ingress the connection's peer is the proxy, so every client would share
its address; the proxy names the client in ``X-Forwarded-For`` or RFC 7239's ``Forwarded``.
Those headers are anyone's to write, so they are read only when the peer is a trusted proxy,
and then from the right: each hop appends the address it received the request from, so the
right-most address that is not itself a trusted proxy is the client, and whatever a client
wrote further left (a spoofed address) is never reached. ``Forwarded`` wins over
``X-Forwarded-For`` when a request has both; the scheme comes from its ``proto`` (or
``X-Forwarded-Proto``) the same way.

:class:`ForwardedClient` rewrites the ASGI scope's ``client`` (and ``scheme``) in place, once
per request and before anything reads them, so uvicorn's access line names the client too.
uvicorn's own proxy-header handling is off (``proxy_headers=False`` in
``service.__main__.uvicorn_config``): one mechanism, one setting, applied once.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Sequence

from starlette.types import ASGIApp, Receive, Scope, Send

Network = ipaddress.IPv4Network | ipaddress.IPv6Network
Address = ipaddress.IPv4Address | ipaddress.IPv6Address


def parse_networks(setting: str) -> tuple[Network, ...]:
    """``MT_TRUSTED_PROXIES``: comma-separated addresses and CIDRs (``10.0.0.0/8``,
    ``::1``); ``ValueError`` naming an entry that is neither."""
    networks = []
    for entry in (part.strip() for part in setting.split(",")):
        if not entry:
            continue
        try:
            networks.append(ipaddress.ip_network(entry, strict=False))
        except ValueError:
            raise ValueError(
                f"MT_TRUSTED_PROXIES: {entry!r} is neither an IP address nor a CIDR"
            ) from None
    return tuple(networks)


def _address(node: str) -> Address | None:
    """An address as proxies write one (``192.0.2.1``, ``192.0.2.1:4711``, ``[2001:db8::1]``,
    ``[2001:db8::1]:4711``, ``2001:db8::1``); None for anything else (``unknown``, an
    obfuscated ``_id``)."""
    node = node.strip().strip('"')
    if node.startswith("["):
        node = node[1:].partition("]")[0]
    elif node.count(":") == 1:
        node = node.partition(":")[0]
    try:
        address = ipaddress.ip_address(node)
    except ValueError:
        return None
    # A dual-stack socket names an IPv4 peer ::ffff:a.b.c.d: the IPv4 ranges hold it.
    mapped = address.ipv4_mapped if isinstance(address, ipaddress.IPv6Address) else None
    return mapped or address


def _forwarded_pairs(values: Iterable[str]) -> list[dict[str, str]]:
    """RFC 7239 ``Forwarded`` elements (one per hop, left to right) as parameter dicts."""
    elements = []
    for value in values:
        for element in value.split(","):
            pairs = {}
            for pair in element.split(";"):
                name, sep, token = pair.partition("=")
                if sep:
                    pairs[name.strip().lower()] = token.strip().strip('"')
            elements.append(pairs)
    return elements


class TrustedProxies:
    """Which peers may name the client, and the client they name."""

    def __init__(self, networks: Sequence[Network]) -> None:
        self.networks = tuple(networks)

    @classmethod
    def parse(cls, setting: str) -> TrustedProxies:
        return cls(parse_networks(setting))

    def trusts(self, host: str) -> bool:
        address = _address(host)
        return address is not None and any(address in network for network in self.networks)

    def client(self, peer: str, headers: Sequence[tuple[bytes, bytes]]) -> tuple[str, str | None]:
        """(the client's address, the scheme the client used or None) for a request from
        ``peer`` with these raw headers. An untrusted peer is the client, whatever it sent."""
        if not self.networks or not self.trusts(peer):
            return peer, None
        forwarded, forwarded_for, forwarded_proto = [], [], []
        for name, value in headers:
            if name == b"forwarded":
                forwarded.append(value.decode("latin-1"))
            elif name == b"x-forwarded-for":
                forwarded_for.append(value.decode("latin-1"))
            elif name == b"x-forwarded-proto":
                forwarded_proto.append(value.decode("latin-1"))
        protos: list[str | None]
        if forwarded:
            elements = _forwarded_pairs(forwarded)
            hops = [element.get("for", "") for element in elements]
            protos = [element.get("proto") for element in elements]
        else:
            hops = [hop for value in forwarded_for for hop in value.split(",")]
            proto = ",".join(forwarded_proto).split(",")[-1].strip() or None
            # X-Forwarded-Proto is the nearest proxy's: the scheme of the last hop.
            protos = [None] * len(hops)
            if hops:
                protos[-1] = proto
        client, scheme = peer, None
        # From the right: each trusted hop vouches for the one to its left.
        for hop, proto in zip(reversed(hops), reversed(protos), strict=True):
            node = hop.strip().strip('"')
            if not node:
                break
            address = _address(node)
            client = str(address) if address is not None else node
            scheme = proto.lower() if proto and proto.lower() in ("http", "https") else scheme
            if address is None or not any(address in n for n in self.networks):
                break  # an untrusted address (or an obfuscated name): the client
        return client, scheme


class ForwardedClient:
    """ASGI middleware: the scope's ``client`` (and ``scheme``) as ``TrustedProxies`` reads
    them, for every HTTP and WebSocket request."""

    def __init__(self, app: ASGIApp, proxies: TrustedProxies) -> None:
        self.app = app
        self.proxies = proxies

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        peer = scope.get("client")
        if scope["type"] in ("http", "websocket") and peer and self.proxies.networks:
            host, scheme = self.proxies.client(peer[0], scope.get("headers") or [])
            if host != peer[0]:
                scope["client"] = (host, 0)
            if scheme is not None:
                if scope["type"] == "websocket":
                    scheme = "wss" if scheme == "https" else "ws"
                scope["scheme"] = scheme
        await self.app(scope, receive, send)
