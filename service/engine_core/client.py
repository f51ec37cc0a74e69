"""The front-end's side: ``EngineCoreClient`` has the batcher's interface (``RowBatcher``), so
the translator does not know whether its rows decode in this process or in engine cores.

The client holds a DEALER socket to each replica of its model and sends each request's rows
to the live replica with the fewest rows outstanding from this front-end (the replica's
reported queue breaks ties). Every front-end talks to the same replicas, so a replica's batch
holds every front-end's rows.

A replica is live from its first ``Pong`` until its socket disconnects (the process died: the
kernel closes its end at once) or it stays silent for ``silence_s`` (hung). When it stops
being live, the rows in flight on it fail at once with ``EngineUnavailable`` (503 +
Retry-After): never lost, never answered by another process that does not hold them. New rows
go to the replicas still live; none live is ``EngineUnavailable`` at once. The supervisor
restarts the process, the DEALER reconnects on its own, and the first pong makes the replica
live again.

Each row of a request is a ``ScheduledSentence`` here as in the in-process batcher (its
``unit`` is the request id), so ``RowStream`` serves both, and a timeout or a hang-up abandons the unfinished
rows the same way: the client sends ``Abort`` and the engine core drops them.

A retired engine core's pong names the engine cores its model moved to; the client hands
them to ``on_moved`` (the front-end then loads the model again, on them) and, once closed
after its last row, sends every replica ``Detach`` so the old cores may stop. While no replica
is live it also asks the supervisor where the model is (``Locate``, every ``ASK_S``): a client
whose old cores stopped before it was heard (it started just as they retired, or its event
loop was held past their wait) learns the move from the supervisor's ``Retire`` instead.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import time
import uuid
from collections.abc import Callable, Iterator, Sequence

from service.engine_core.control import ASK_S
from service.engine_core.links import PendingRequest, Replica, ReplicaLinks
from service.engine_core.protocol import (
    Abort,
    Accepted,
    Detach,
    EngineCoreInfo,
    Failed,
    FromCore,
    Pong,
    Retire,
    RowsDone,
    error_of,
    submit,
)
from service.engine_core.retirement import FRONTEND_PREFIX
from service.errors import EngineUnavailable, NotAccepting, QueueFull
from service.metrics import ServiceMetrics
from service.runtime.types import DecodeRequest
from service.scheduling.sentences import RowResult, ScheduledSentence
from service.scheduling.stream import RowStream, all_rows

logger = logging.getLogger(__name__)

PING_S = 0.1  # how often each replica is pinged
# A live replica silent this long is taken for hung. A core that died is seen at once (its
# connection closes); one that lives answers pings from its event loop, which a long
# admission pass over thousands of queued sentences, or a machine with more runnable threads
# than CPUs, can hold for most of a second: a shorter bound fails its rows while it works.
SILENCE_S = 2.0
# Just after start the first pongs are on their way (the loader's probe found a core up):
# a request waits this long for them rather than being refused.
FIRST_PONG_WAIT_S = 1.0

# Where a model moved (a retired core's pong): the successors' addresses, the plan's version.
OnMoved = Callable[[list[str], int], None]


class EngineCoreClient:
    """A model's batcher whose engine runs in engine-core processes at ``addresses``."""

    def __init__(
        self,
        addresses: Sequence[str],
        info: EngineCoreInfo,
        metrics: ServiceMetrics | None = None,
        *,
        ping_s: float = PING_S,
        silence_s: float = SILENCE_S,
        clock: Callable[[], float] = time.monotonic,
        on_moved: OnMoved | None = None,
        supervisor: str = "",
        ask_s: float = ASK_S,
    ) -> None:
        self.info = info
        self.metrics = metrics if metrics is not None else ServiceMetrics().for_model(info.model_id)
        self.max_queue = info.max_queue
        self.replicas = [Replica(index, address) for index, address in enumerate(addresses)]
        self._silence_s = silence_s
        self._clock = clock
        self._on_moved = on_moved
        identity = FRONTEND_PREFIX + f"{os.getpid()}-{uuid.uuid4().hex[:8]}".encode()
        supervisor = supervisor if on_moved is not None else ""  # nobody to tell the answer
        self._links = ReplicaLinks(self.replicas, identity, self, ping_s, clock)
        if supervisor:
            self._links.ask_when_none_live(supervisor, info.model_id, ask_s)
        self._request_ids = itertools.count()
        self._sentence_ids = itertools.count()
        self._requests: dict[int, PendingRequest] = {}
        self._accepting = True
        self._closed = False
        self._started_at = 0.0

    # --- the batcher's interface -------------------------------------------------------------

    def start(self) -> None:
        """Connect to every replica (on the event loop that will submit)."""
        if self._links.started:
            return
        self._started_at = self._clock()
        self._links.start()

    @property
    def accepting(self) -> bool:
        return self._accepting

    @property
    def queue_depth(self) -> int:
        return sum(replica.queue_depth for replica in self.replicas)

    @property
    def alive(self) -> bool:
        """True until closed: a dead replica is restarted, and this front-end serves again."""
        return not self._closed

    @property
    def live_replicas(self) -> int:
        return sum(replica.usable for replica in self.replicas)

    async def until_live(self) -> None:
        """At start-up, up to ``FIRST_PONG_WAIT_S`` for a replica's first pong (none is live)."""
        while not self.live_replicas and self._clock() - self._started_at < FIRST_PONG_WAIT_S:
            await asyncio.sleep(0.01)

    async def submit(
        self,
        rows: Sequence[DecodeRequest],
        timeout_s: float | None = None,
        background: bool = False,
    ) -> list[RowResult]:
        """As ``ContinuousBatcher.submit``; a replica's death fails them (``EngineUnavailable``)."""
        if not rows:
            return []
        await self.until_live()
        return await all_rows(self, self._send(rows, timeout_s, background, False), timeout_s)

    def submit_as_completed(
        self,
        rows: Sequence[DecodeRequest],
        timeout_s: float | None = None,
        background: bool = False,
    ) -> RowStream:
        """As ``ContinuousBatcher.submit_as_completed``. A refusal known here raises at once;
        the engine core's own (its queue full with others' rows) from ``started()``."""
        if not rows:
            return RowStream(self, [], timeout_s)
        sentences = self._send(rows, timeout_s, background, ack=True)
        return RowStream(self, sentences, timeout_s, self._requests[sentences[0].unit].queued)

    def abandon(self, sentences: Sequence[ScheduledSentence]) -> None:
        """Sentences nobody waits for any more: the engine core drops them."""
        for sentence in sentences:
            sentence.future.cancel()
        if not sentences:
            return
        request = self._requests.get(sentences[0].unit)
        if request is not None:
            self._forget(request)
            self._links.post(request.replica, Abort(request.request_id))

    def begin_shutdown(self) -> None:
        self._accepting = False

    async def shutdown(self, grace_s: float) -> bool:
        """Refuse new work, wait up to ``grace_s`` for the rows in flight, then close."""
        self.begin_shutdown()
        deadline = self._clock() + grace_s
        while self._requests and self._clock() < deadline:
            await asyncio.sleep(0.02)
        drained = not self._requests
        self.close()
        return drained

    def close(self) -> None:
        """Fail what is in flight (``NotAccepting``), detach and close the sockets."""
        self._accepting, self._closed = False, True
        for request in list(self._requests.values()):
            self._fail(request, NotAccepting("shutting_down"))
            self._links.post(request.replica, Abort(request.request_id))  # the core drops them too
        self._links.close(farewell=Detach())

    # --- sending -----------------------------------------------------------------------------

    def _send(
        self, rows: Sequence[DecodeRequest], timeout_s: float | None, background: bool, ack: bool
    ) -> list[ScheduledSentence]:
        if not self._accepting:
            raise NotAccepting("shutting_down")
        if (replica := least_loaded(self.replicas, len(rows), self.max_queue)) is None:
            raise EngineUnavailable(unavailable(self.info.model_id))
        loop = asyncio.get_running_loop()
        request_id = next(self._request_ids)
        sentences = scheduled(rows, self._sentence_ids, request_id, background)
        accepted = loop.create_future() if ack else None
        request = PendingRequest(request_id, replica, sentences, accepted)
        if not self._links.post(replica, submit(request_id, rows, background, timeout_s, ack)):
            self._lost(replica, "its socket refused a message")
            raise EngineUnavailable(unavailable(self.info.model_id))
        self._requests[request_id] = request
        replica.requests[request_id] = request
        replica.outstanding_rows += request.rows_left
        return sentences

    # --- receiving ---------------------------------------------------------------------------

    def received(self, replica: Replica, message: FromCore) -> None:
        if isinstance(message, RowsDone):
            self._rows_done(replica, message)
        elif isinstance(message, Accepted) and (known := replica.requests.get(message.request_id)):
            known.accept()
        elif isinstance(message, Failed):
            request = replica.requests.get(message.request_id)
            if request is not None:
                self._fail(request, error_of(message))
        elif isinstance(message, Pong):
            self._pong(replica, message)

    def disconnected(self, replica: Replica) -> None:
        if replica.live:
            self._lost(replica, "its connection closed")

    def heartbeat(self, now: float) -> None:
        for replica in self.replicas:
            if replica.live and now - replica.heard_at > self._silence_s:
                self._lost(replica, f"it was silent for {now - replica.heard_at:.2f} s")

    def relocated(self, order: Retire) -> None:
        """The supervisor's answer: the plan has the model on other cores now."""
        if self._on_moved is not None:
            self._on_moved(order.successors, order.plan_version)

    def _pong(self, replica: Replica, pong: Pong) -> None:
        previous = replica.load
        if previous is not None and previous.pid != pong.load.pid and replica.requests:
            # another process answers at this address: the rows sent to the old one are gone
            self._lost(replica, f"process {previous.pid} was replaced by {pong.load.pid}")
        replica.load = pong.load
        if pong.moved_to and self._on_moved is not None:  # retired: the plan keeps what is news
            self._on_moved(pong.moved_to, pong.plan_version)
        if not replica.live:
            replica.live = True
            model_id, pid = self.info.model_id, pong.load.pid
            logger.info("engine core %d of %s is up (pid %d)", replica.index, model_id, pid)
        show_queue_depth(self.metrics, self.queue_depth)

    def _rows_done(self, replica: Replica, message: RowsDone) -> None:
        """One engine step's finished rows of this front-end's requests."""
        for row in message.rows:
            request = replica.requests.get(row.request_id)
            if request is None:
                continue  # abandoned or failed meanwhile
            replica.outstanding_rows -= request.row_done(row.index, row.result())
            if request.finished:
                self._forget(request)

    def _lost(self, replica: Replica, why: str) -> None:
        """The replica is not live any more: fail its rows in flight at once."""
        was_live, replica.live = replica.live, False
        in_flight = list(replica.requests.values())
        if was_live or in_flight:
            what = f"engine core {replica.index} of {self.info.model_id} is unavailable ({why})"
            logger.error("%s; %d requests in flight fail with 503", what, len(in_flight))
        for request in in_flight:
            self._fail(request, EngineUnavailable(unavailable(self.info.model_id)))
            self._links.post(replica, Abort(request.request_id))  # where it is only hung
        show_queue_depth(self.metrics, self.queue_depth)

    def _fail(self, request: PendingRequest, error: BaseException) -> None:
        self._forget(request)
        request.fail(error)

    def _forget(self, request: PendingRequest) -> None:
        if self._requests.pop(request.request_id, None) is None:
            return
        replica = request.replica
        replica.requests.pop(request.request_id, None)
        replica.outstanding_rows -= request.rows_left
        request.rows_left = 0


def scheduled(
    rows: Sequence[DecodeRequest], ids: Iterator[int], request_id: int, background: bool
) -> list[ScheduledSentence]:
    """A request's rows as the in-process batcher holds them (the request id as their unit),
    their futures on the running event loop."""
    loop = asyncio.get_running_loop()
    return [
        ScheduledSentence(
            next(ids), row, loop.create_future(), loop, unit=request_id, background=background
        )
        for row in rows
    ]


def unavailable(model_id: str) -> str:
    return f"no engine core of model {model_id} is up; retry shortly"


def show_queue_depth(metrics: ServiceMetrics, depth: int) -> None:
    # With shared metrics the engine cores' own gauges are summed: this one would count their
    # queues again.
    if metrics.shared_dir is None:
        metrics.queue_depth.set(depth)


def least_loaded(replicas: Sequence[Replica], sentences: int, max_queue: int) -> Replica | None:
    """The live replica with the fewest rows outstanding from this front-end (its reported
    queue breaks ties); None where none is live. ``QueueFull`` where that replica's queue has
    no room for ``sentences``: as the engine core's own queue, an empty one takes any request
    (one within the text limits may have more sentences than MT_MAX_QUEUE)."""
    usable = [replica for replica in replicas if replica.usable]
    if not usable:
        return None
    replica = min(usable, key=lambda r: (r.outstanding_rows, r.queue_depth, r.index))
    if replica.queue_depth and replica.queue_depth + sentences > max_queue:
        raise QueueFull(
            f"the queue is full ({replica.queue_depth} of MT_MAX_QUEUE={max_queue} "
            f"sentences waiting; this request has {sentences})"
        )
    return replica
