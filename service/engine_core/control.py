"""The engine cores' control, off the serving path's event loop (blocking ZeroMQ sockets):
``probe``, by which a front-end learns what model engine cores serve before it builds their
client, and ``CoreControl``, the supervisor's socket to each engine core of one model's
generation: readiness (the first ``Pong``), its ``Retire`` and the core's ``Free``.
"""

from __future__ import annotations

import contextlib
import os
import time
import uuid
from collections.abc import Sequence

import zmq

from service.engine_core.protocol import Free, Ping, Pong, Retire, decode_from_core, encode
from service.engine_core.retirement import FRONTEND_PREFIX
from service.engine_core.sockets import tuned
from service.errors import EngineUnavailable

SUPERVISOR = b"supervisor"


def ping_socket(context: zmq.Context, address: str, identity: bytes) -> zmq.Socket:
    """A socket to the engine core at ``address`` that sends nothing before it is up."""
    socket = context.socket(zmq.DEALER)
    tuned(socket)
    socket.setsockopt(zmq.IDENTITY, identity)
    socket.setsockopt(zmq.IMMEDIATE, 1)
    socket.connect(address)
    return socket


def probe(addresses: Sequence[str], timeout_s: float, poll_s: float = 0.2) -> Pong:
    """The first ``Pong`` of an engine core at ``addresses``: the model it serves, and where
    it moved if it is retired (blocking: a loader thread waits here while the cores load).
    The socket names itself a front-end's: a retired core waits for it as for any front-end."""
    context = zmq.Context()
    identity = FRONTEND_PREFIX + f"{os.getpid()}-probe-{uuid.uuid4().hex[:8]}".encode()
    sockets = []
    try:
        poller = zmq.Poller()
        for address in addresses:
            socket = ping_socket(context, address, identity)
            poller.register(socket, zmq.POLLIN)
            sockets.append(socket)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for socket in sockets:
                with contextlib.suppress(zmq.Again):  # not up yet
                    socket.send(encode(Ping(time.monotonic())), zmq.DONTWAIT)
            for socket, _ in poller.poll(round(poll_s * 1000)):
                message = decode_from_core(socket.recv())
                if isinstance(message, Pong):
                    return message
        raise EngineUnavailable(f"no engine core answered at {', '.join(addresses)}")
    finally:
        for socket in sockets:
            socket.close(linger=0)
        context.term()


class CoreControl:
    """The supervisor's sockets to the engine cores at ``addresses`` (one generation of one
    model), asked without waiting at each turn of its loop."""

    def __init__(self, addresses: Sequence[str]) -> None:
        self.addresses = list(addresses)
        self._context = zmq.Context()
        self._sockets = {
            address: ping_socket(self._context, address, SUPERVISOR) for address in addresses
        }
        self._answered: set[str] = set()  # a Pong came
        self._order: Retire | None = None
        self._ordered: set[str] = set()  # the Retire is on its way
        self.freed: set[str] = set()

    @property
    def ready(self) -> bool:
        """Every engine core answered a ping."""
        return len(self._answered) == len(self.addresses)

    def retire(self, successors: list[str], plan_version: int) -> None:
        """Send every core ``Retire`` (now where connected, else at the next ``poll``)."""
        self._order = Retire(successors, plan_version)
        self._ordered.clear()
        self.poll()

    def poll(self) -> None:
        """Read the answers; ping the cores not yet ready; send the order where not sent."""
        for address, socket in self._sockets.items():
            with contextlib.suppress(zmq.Again):  # nothing (more) to read
                while True:
                    message = decode_from_core(socket.recv(zmq.DONTWAIT))
                    if isinstance(message, Pong):
                        self._answered.add(address)
                    elif isinstance(message, Free):
                        self.freed.add(address)
            with contextlib.suppress(zmq.Again):  # not connected (yet, or any more)
                if address not in self._answered:
                    socket.send(encode(Ping(time.monotonic())), zmq.DONTWAIT)
                if self._order is not None and address not in self._ordered:
                    socket.send(encode(self._order), zmq.DONTWAIT)
                    self._ordered.add(address)

    def close(self) -> None:
        for socket in self._sockets.values():
            socket.close(linger=0)
        self._sockets.clear()
        self._context.term()
