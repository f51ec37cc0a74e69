"""The engine cores' control, off the serving path's event loop (blocking ZeroMQ sockets):
``find_cores``, by which a front-end learns where a model's engine cores are and what model
they serve before it builds their client (a retired core's pong, or the supervisor's
``PlanDesk``, tells it where the model moved), and ``CoreControl``, the supervisor's socket to
each engine core of one model's generation: readiness (the first ``Pong``), its ``Retire`` and
the core's ``Free``.
"""

from __future__ import annotations

import contextlib
import os
import time
import uuid
from collections.abc import Sequence
from typing import Protocol

import msgspec
import zmq

from service.engine_core.plan import ProcessPlan
from service.engine_core.protocol import (
    Free,
    Locate,
    Ping,
    Pong,
    Retire,
    decode_from_core,
    decode_from_supervisor,
    decode_to_supervisor,
    encode,
)
from service.engine_core.retirement import FRONTEND_PREFIX
from service.engine_core.sockets import tuned
from service.errors import EngineUnavailable

SUPERVISOR = b"supervisor"
# How often a probe whose cores stay silent asks the supervisor again where the model is (the
# first time at once; the supervisor answers only where the plan names other cores).
ASK_S = 1.0


def ping_socket(context: zmq.Context, address: str, identity: bytes) -> zmq.Socket:
    """A socket to the engine core at ``address`` that sends nothing before it is up."""
    socket = context.socket(zmq.DEALER)
    tuned(socket)
    socket.setsockopt(zmq.IDENTITY, identity)
    socket.setsockopt(zmq.IMMEDIATE, 1)
    socket.connect(address)
    return socket


def probe(
    addresses: Sequence[str],
    timeout_s: float,
    poll_s: float = 0.2,
    *,
    supervisor: str = "",
    model_id: str = "",
    ask_s: float = ASK_S,
) -> Pong | Retire:
    """The first ``Pong`` of an engine core at ``addresses``: the model it serves, and where
    it moved if it is retired (blocking: a loader thread waits here while the cores load).
    The socket names itself a front-end's: a retired core waits for it as for any front-end.

    Given the ``supervisor``'s address, it is asked at once and every ``ask_s`` where
    ``model_id`` is; its ``Retire``, where the plan names other cores now, is the answer: the
    cores at ``addresses`` may have stopped before this front-end ever reached them."""
    context = zmq.Context()
    identity = FRONTEND_PREFIX + f"{os.getpid()}-probe-{uuid.uuid4().hex[:8]}".encode()
    sockets = []
    try:
        poller = zmq.Poller()
        for address in addresses:
            socket = ping_socket(context, address, identity)
            poller.register(socket, zmq.POLLIN)
            sockets.append(socket)
        desk = ping_socket(context, supervisor, identity) if supervisor else None
        if desk is not None:
            poller.register(desk, zmq.POLLIN)
        question, asked_at = encode(Locate(model_id, list(addresses))), -ask_s
        deadline = time.monotonic() + timeout_s
        while (now := time.monotonic()) < deadline:
            for socket in sockets:
                with contextlib.suppress(zmq.Again):  # not up yet
                    socket.send(encode(Ping(now)), zmq.DONTWAIT)
            if desk is not None and now - asked_at >= ask_s:
                with contextlib.suppress(zmq.Again):  # not connected yet: asked next turn
                    desk.send(question, zmq.DONTWAIT)
                    asked_at = now
            for socket, _ in poller.poll(round(poll_s * 1000)):
                if socket is desk:
                    return decode_from_supervisor(socket.recv())
                message = decode_from_core(socket.recv())
                if isinstance(message, Pong):
                    return message
        raise EngineUnavailable(f"no engine core answered at {', '.join(addresses)}")
    finally:
        for socket in sockets:
            socket.close(linger=0)
        if desk is not None:
            desk.close(linger=0)
        context.term()


class KnownPlan(Protocol):
    """Where a front-end knows each model's engine cores to be (its ``PlanFollower``)."""

    addresses: dict[str, list[str]]

    def follow(self, model_id: str, addresses: list[str], version: int) -> bool:
        """The model moved to ``addresses`` in plan ``version``; whether that is news."""
        ...


def find_cores(
    model_id: str, plan: KnownPlan, timeout_s: float, supervisor: str = ""
) -> tuple[list[str], Pong]:
    """``model_id``'s engine cores as ``plan`` knows them, and the first ``Pong`` of one of
    them, after following each move a retired core or the ``supervisor`` tells of (within
    ``timeout_s`` in all: the cores may be loading)."""
    deadline = time.monotonic() + timeout_s
    while True:
        addresses = plan.addresses[model_id]
        left_s = deadline - time.monotonic()
        answer = probe(addresses, left_s, supervisor=supervisor, model_id=model_id)
        if isinstance(answer, Pong):
            if not answer.moved_to:
                return addresses, answer
            moved_to = answer.moved_to
        else:
            moved_to = answer.successors
        news = plan.follow(model_id, moved_to, answer.plan_version)
        if not news and isinstance(answer, Pong) and plan.addresses[model_id] == addresses:
            return addresses, answer  # a stale word: the plan knows better; this core serves


class PlanDesk:
    """The supervisor's socket at ``address`` where front-ends ask where a model's engine
    cores are now (``Locate``): a front-end started with the plan as it was before a move
    finds the old cores stopped, and learns the move here rather than from their pongs."""

    def __init__(self, address: str) -> None:
        self._context = zmq.Context()
        self._socket = self._context.socket(zmq.ROUTER)
        tuned(self._socket)
        self._socket.bind(address)

    def answer(self, plan: ProcessPlan, wait_s: float = 0.0) -> None:
        """Answer every question waiting (up to ``wait_s`` for the first) from ``plan``: the
        model's cores and the plan's version where they are not those the front-end knows."""
        if not self._socket.poll(round(wait_s * 1000)):
            return
        with contextlib.suppress(zmq.Again):  # nothing (more) to read
            while True:
                frames = self._socket.recv_multipart(zmq.DONTWAIT)
                try:
                    [peer, payload] = frames
                    question = decode_to_supervisor(payload)
                except (ValueError, msgspec.DecodeError):
                    continue  # not a front-end's question
                now = plan.addresses.get(question.model_id)
                if now is not None and now != question.addresses:
                    reply = encode(Retire(now, plan.version))
                    self._socket.send_multipart([peer, reply], zmq.DONTWAIT)

    def close(self) -> None:
        self._socket.close(linger=0)
        self._context.term()


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
