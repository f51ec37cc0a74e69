"""A front-end's sockets to one model's engine-core replicas, and what it knows of each.

``ReplicaLinks`` owns the ZeroMQ side: a DEALER socket per replica (reconnecting on its own
after the supervisor restarts the process), a reader per socket, a monitor that reports a
closed connection at once (the kernel closes a dead process's end), the heartbeat that
pings every replica, and a socket to the supervisor's ``PlanDesk`` where one is given (where
a model is now, service/engine_core/control.py). What the messages mean is the client's
(``LinkEvents``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

import msgspec
import zmq
import zmq.asyncio
from zmq.utils.monitor import parse_monitor_message

from service.engine_core.protocol import (
    CoreLoad,
    FromCore,
    Locate,
    Ping,
    Retire,
    ToCore,
    decode_from_core,
    decode_from_supervisor,
    encode,
)
from service.engine_core.sockets import tuned
from service.scheduling.sentences import RowResult, ScheduledSentence

logger = logging.getLogger(__name__)
_Message = TypeVar("_Message")
# Loop turns (1 ms each) the monitor waits, at a closed connection, for the reader to take the
# messages already in the socket; a reader that needs longer is not reading.
ARRIVED_TURNS = 100

# How long a last message may take to leave as its socket closes (a local socket: at once).
FAREWELL_LINGER_MS = 500


@dataclass(eq=False)
class PendingRequest:
    request_id: int
    replica: Replica
    sentences: list[ScheduledSentence]
    accepted: asyncio.Future[None] | None = None  # set on the core's Accepted, where asked
    rows_left: int = field(init=False)  # rows (beams) of the sentences not yet answered

    def __post_init__(self) -> None:
        self.rows_left = sum(sentence.rows for sentence in self.sentences)

    @property
    def finished(self) -> bool:
        return all(sentence.future.done() for sentence in self.sentences)

    def row_done(self, index: int, result: RowResult) -> int:
        """The engine core's answer for row ``index``: the rows (beams) it answers, 0 where
        that row was answered (or abandoned) already."""
        if not 0 <= index < len(self.sentences) or self.sentences[index].future.done():
            return 0
        sentence = self.sentences[index]
        sentence.future.set_result(result)
        self.rows_left -= sentence.rows
        return sentence.rows

    def fail(self, error: BaseException) -> None:
        """Every row not yet answered fails with ``error``."""
        for sentence in self.sentences:
            if not sentence.future.done():
                sentence.future.set_exception(error)

    def accept(self) -> None:
        """The engine core's ``Accepted``: the rows are queued there."""
        if self.accepted is not None and not self.accepted.done():
            self.accepted.set_result(None)

    async def queued(self) -> None:
        """Until the engine core has queued the rows (``Accepted``, or a row answered); its
        refusal, or the loss of the core, raises here: either fails every row, so the first
        row's error is the request's."""
        assert self.accepted is not None, "the Submit asked for no Accepted"
        futures: list[asyncio.Future[Any]] = [self.accepted]
        futures += [sentence.future for sentence in self.sentences]
        await asyncio.wait(futures, return_when=asyncio.FIRST_COMPLETED)
        if self.accepted.done():
            return
        # every failed row's error read (none is left to be logged as never retrieved)
        errors = [
            error
            for sentence in self.sentences
            if sentence.future.done() and not sentence.future.cancelled()
            if (error := sentence.future.exception()) is not None
        ]
        if errors:
            raise errors[0]


@dataclass(eq=False)
class Replica:
    """One engine-core process of the model, as this front-end sees it."""

    index: int
    address: str
    socket: zmq.asyncio.Socket | None = None
    live: bool = False
    heard_at: float = 0.0
    load: CoreLoad | None = None
    outstanding_rows: int = 0  # this front-end's rows sent and not answered
    requests: dict[int, PendingRequest] = field(default_factory=dict)

    @property
    def usable(self) -> bool:
        return self.live and self.load is not None and self.load.accepting

    @property
    def queue_depth(self) -> int:
        return self.load.queue_depth if self.live and self.load is not None else 0


class LinkEvents(Protocol):
    def received(self, replica: Replica, message: FromCore) -> None: ...
    def disconnected(self, replica: Replica) -> None: ...
    def heartbeat(self, now: float) -> None: ...
    def relocated(self, order: Retire) -> None: ...


class ReplicaLinks:
    """The sockets to ``replicas``; events go to ``events`` on the event loop."""

    def __init__(
        self,
        replicas: Sequence[Replica],
        identity: bytes,
        events: LinkEvents,
        ping_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.replicas = replicas
        self._identity = identity
        self._events = events
        self._ping_s = ping_s
        self._clock = clock
        self._supervisor = ""
        self._question: Locate | None = None
        self._ask_s = 0.0
        self._asked_at: float | None = None
        self._desk: zmq.asyncio.Socket | None = None
        self._context: zmq.asyncio.Context | None = None
        self._monitors: list[zmq.asyncio.Socket] = []
        self._tasks: list[asyncio.Task[None]] = []

    @property
    def started(self) -> bool:
        return self._context is not None

    def start(self) -> None:
        """Connect to every replica (on the event loop that will use them)."""
        self._context = zmq.asyncio.Context()
        for replica in self.replicas:
            self._connect(replica)
        if self._supervisor:
            self._desk = self._dealer()
            self._desk.connect(self._supervisor)
            self._tasks.append(asyncio.create_task(self._read_desk(self._desk)))
        self._tasks.append(asyncio.create_task(self._heartbeat(), name="engine-core-heartbeat"))

    def post(self, replica: Replica, message: ToCore) -> bool:
        """Send without waiting; False where the replica is not connected."""
        if replica.socket is None:
            return False
        sent = replica.socket.send(encode(message), zmq.DONTWAIT)
        # DONTWAIT with nothing queued before it: the future is settled already
        assert isinstance(sent, asyncio.Future)
        return sent.done() and sent.exception() is None

    def ask_when_none_live(self, supervisor: str, model_id: str, ask_s: float) -> None:
        """While none of the replicas is live, ask ``supervisor`` every ``ask_s`` where the
        model is (``Locate``; before ``start``): cores that stopped before they heard this
        front-end cannot tell it they moved, the plan can (its answer: ``relocated``)."""
        self._supervisor, self._ask_s = supervisor, ask_s
        self._question = Locate(model_id, [replica.address for replica in self.replicas])

    def _ask_if_none_live(self, now: float) -> None:
        if self._desk is None or self._question is None or any(r.live for r in self.replicas):
            self._asked_at = None
        elif self._asked_at is None or now - self._asked_at >= self._ask_s:
            self._asked_at = now
            sent = self._desk.send(encode(self._question), zmq.DONTWAIT)
            assert isinstance(sent, asyncio.Future)
            if sent.done():  # read: a refusal (not connected yet) is not logged as unread
                sent.exception()

    def close(self, farewell: ToCore | None = None) -> None:
        """Close every socket, after sending each replica ``farewell`` where given (closing
        the context waits up to ``FAREWELL_LINGER_MS`` for it to leave)."""
        for task in self._tasks:
            task.cancel()
        self._tasks.clear()
        for replica in self.replicas:
            if farewell is not None:
                self.post(replica, farewell)
            if replica.socket is not None:
                replica.socket.close(linger=FAREWELL_LINGER_MS if farewell is not None else 0)
                replica.socket = None
        for monitor in self._monitors:
            monitor.close(linger=0)
        self._monitors.clear()
        if self._desk is not None:
            self._desk.close(linger=0)
            self._desk = None
        if self._context is not None:
            self._context.term()
            self._context = None

    def _dealer(self) -> zmq.asyncio.Socket:
        assert self._context is not None
        socket = self._context.socket(zmq.DEALER)
        tuned(socket)
        socket.setsockopt(zmq.IDENTITY, self._identity)
        # queue messages only on a connection that is up: a message to a dead replica fails
        # here rather than waiting for whichever process binds the address next
        socket.setsockopt(zmq.IMMEDIATE, 1)
        socket.setsockopt(zmq.RECONNECT_IVL, 50)
        socket.setsockopt(zmq.RECONNECT_IVL_MAX, 500)
        return socket

    def _connect(self, replica: Replica) -> None:
        socket = self._dealer()
        monitor = socket.get_monitor_socket(zmq.EVENT_DISCONNECTED)
        socket.connect(replica.address)
        replica.socket = socket
        self._monitors.append(monitor)
        self._tasks.append(asyncio.create_task(self._read(replica, socket)))
        self._tasks.append(asyncio.create_task(self._watch(replica, monitor)))

    async def _read(self, replica: Replica, socket: zmq.asyncio.Socket) -> None:
        async for message in _messages(socket, decode_from_core, "an engine core"):
            replica.heard_at = self._clock()
            self._events.received(replica, message)

    async def _read_desk(self, socket: zmq.asyncio.Socket) -> None:
        async for order in _messages(socket, decode_from_supervisor, "the supervisor"):
            self._events.relocated(order)

    async def _watch(self, replica: Replica, monitor: zmq.asyncio.Socket) -> None:
        while True:
            event = parse_monitor_message(await monitor.recv_multipart())
            if event["event"] == zmq.EVENT_DISCONNECTED:
                await self._read_what_arrived(replica)
                self._events.disconnected(replica)

    async def _read_what_arrived(self, replica: Replica) -> None:
        """Let the reader take what the core sent before its connection closed: a draining
        core answers its last rows and then exits, and the answers and the monitor's event
        come on two sockets in no order; read first, they are answers, not rows lost."""
        for _ in range(ARRIVED_TURNS):
            socket = replica.socket
            if socket is None or socket.closed or not int(socket.get(zmq.EVENTS)) & zmq.POLLIN:
                return
            await asyncio.sleep(0.001)

    async def _heartbeat(self) -> None:
        last = self._clock()
        while True:
            now = self._clock()
            held = now - last - self._ping_s
            if held > 0:
                # This event loop was held longer than a ping's interval (the front-end's own
                # work, or a machine with more runnable threads than CPUs): the replies sent
                # meanwhile wait unread in the sockets, so that time is no replica's silence.
                for replica in self.replicas:
                    replica.heard_at = min(replica.heard_at + held, now)
            last = now
            self._events.heartbeat(now)
            self._ask_if_none_live(now)
            for replica in self.replicas:
                self.post(replica, Ping(now))
            await asyncio.sleep(self._ping_s)


async def _messages(
    socket: zmq.asyncio.Socket, decode: Callable[[bytes], _Message], sender: str
) -> AsyncIterator[_Message]:
    """Each message ``socket`` receives, decoded; one that does not decode is logged and
    skipped (a peer of another version must not stop the reader)."""
    while True:
        payload = await socket.recv()
        try:
            message = decode(payload)
        except msgspec.DecodeError:
            logger.warning("an undecodable message from %s was ignored", sender)
            continue
        yield message
