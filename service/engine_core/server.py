"""The engine core's side of the socket: a ZeroMQ ROUTER in front of one model replica's
``ContinuousBatcher``.

Every front-end connects a DEALER to the ROUTER, so the rows of every front-end's clients
meet in one queue and one running batch. The event loop here only relays: a ``Submit`` is
queued in the batcher (a refusal answers at once with ``Failed``; an ``Accepted`` follows where
the submission asks), and ``RowAnswers`` answers each front-end once per engine step with one
``RowsDone`` holding every row of its requests the step finished, as vLLM's engine core sends
one ``EngineCoreOutputs`` per step. An ``Abort`` drops the request's rows still queued or
running (as a client's timeout or hang-up does in process). The batcher's engine thread does
the work, as it does in the one-process service.

A retired core (the supervisor's ``Retire``: its model moved to new engine cores) names its
successors in every pong and sends the supervisor ``Free`` once no front-end holds it
(service/engine_core/retirement.py).

Stopping drains: new submissions are refused (``not_accepting``, and the pongs say so, so the
front-ends send none), the rows in flight finish within the grace, then the socket closes.
An engine thread that dies (a bug in its loop: engine errors fail only their rows) has failed
every row it held; the engine core then stops as it does on SIGTERM and ``serve`` returns
False, so its process ends and the supervisor starts a new one, as for a core that died.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial

import msgspec
import zmq
import zmq.asyncio

from service.engine_core.protocol import (
    Abort,
    Accepted,
    CoreLoad,
    Detach,
    EngineCoreInfo,
    Free,
    FromCore,
    Ping,
    Pong,
    Retire,
    RowDone,
    RowsDone,
    Submit,
    decode_to_core,
    encode,
    failure_of,
)
from service.engine_core.retirement import Retirement
from service.engine_core.sockets import tuned
from service.scheduling.batcher import ContinuousBatcher
from service.scheduling.sentences import RowResult, ScheduledSentence

logger = logging.getLogger(__name__)

# How often the engine threads' CPU seconds are published to the shared metrics (a scrape of a
# front-end reads them from there).
PUBLISH_S = 1.0

# The engine core's own deadline for a request: the client's plus this. The client enforces
# its timeout itself and aborts; this only frees rows whose front-end died meanwhile.
DEADLINE_SLACK_S = 5.0

# How often a retired core looks whether it is free (beside each message it receives).
FREE_CHECK_S = 0.1

# How often the engine core looks whether its engine thread still runs.
WATCH_S = 0.1

# How long the socket, once closed, still sends the replies already queued on it (the last
# results and failures of a drain) to front-ends that are slow to read them.
LINGER_MS = 1000


class EngineCoreServer:
    """Serves one batcher on ``address`` until ``stop``; ``serve`` returns whether it drained."""

    def __init__(self, batcher: ContinuousBatcher, info: EngineCoreInfo, address: str) -> None:
        self.batcher = batcher
        self.info = info
        self.address = address
        self._outbox: asyncio.Queue[tuple[bytes, bytes]] = asyncio.Queue()
        self.answers = RowAnswers(batcher, self._send)
        self._stop = asyncio.Event()
        self._draining = False
        self.retirement = Retirement()
        self._engine_died = False

    def stop(self) -> None:
        """Begin the drain (from the event loop: a signal handler calls it)."""
        self._stop.set()

    async def serve(self, grace_s: float) -> bool:
        context = zmq.asyncio.Context()
        router = context.socket(zmq.ROUTER)
        tuned(router)
        router.bind(self.address)
        self.batcher.start()
        tasks = [
            asyncio.create_task(self._read(router), name="engine-core-read"),
            asyncio.create_task(self._write(router), name="engine-core-write"),
            asyncio.create_task(self._watch_retirement(), name="engine-core-retirement"),
            asyncio.create_task(self._watch(), name="engine-core-watch"),
        ]
        if (publisher := self.batcher.metrics.thread_publisher) is not None:
            tasks.append(asyncio.create_task(self._publish(publisher.publish)))
        logger.info("engine core of %s serving on %s", self.info.model_id, self.address)
        try:
            await self._stop.wait()
            self._draining = True
            logger.info("engine core of %s draining (grace %.0f s)", self.info.model_id, grace_s)
            drained = await self.batcher.shutdown(grace_s)
            # the last results and failures reach the front-ends before the socket closes
            await self.answers.settled(timeout_s=1.0)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(1.0):
                    await self._outbox.join()
            return drained and not self._engine_died
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            router.close(linger=LINGER_MS)
            context.term()

    async def _watch(self) -> None:
        while self.batcher.alive:
            await asyncio.sleep(WATCH_S)
        logger.critical(
            "the engine thread of %s died; the engine core stops to be restarted",
            self.info.model_id,
        )
        self._engine_died = True
        self.stop()

    async def _publish(self, publish: Callable[[], None]) -> None:
        while True:
            await asyncio.sleep(PUBLISH_S)
            publish()

    # --- receiving ------------------------------------------------------------------------

    async def _read(self, router: zmq.asyncio.Socket) -> None:
        while True:
            peer, payload = await router.recv_multipart()
            try:
                message = decode_to_core(payload)
            except msgspec.DecodeError:
                logger.warning("an undecodable message from a front-end was ignored")
                continue
            self.retirement.heard(peer)
            if isinstance(message, Submit):
                self._submit(peer, message)
            elif isinstance(message, Abort):
                self.answers.abort(peer, message.request_id)
            elif isinstance(message, Ping):
                self._send(peer, self._pong(message))
            else:
                self._control(peer, message)

    def _pong(self, ping: Ping) -> Pong:
        order = self.retirement.order
        if order is None:
            return Pong(ping.sent_at, self.info, self.load())
        return Pong(ping.sent_at, self.info, self.load(), order.successors, order.plan_version)

    def _control(self, peer: bytes, message: Detach | Retire) -> None:
        if isinstance(message, Retire):
            if self.retirement.order is None:
                model_id, version = self.info.model_id, message.plan_version
                logger.info("engine core of %s retired by plan version %d", model_id, version)
            self.retirement.retire(peer, message)
        else:
            self.retirement.detach(peer)
        self._report_free()

    def _report_free(self) -> None:
        retirement = self.retirement
        if retirement.free(self.answers.peers()):
            assert retirement.order is not None and retirement.supervisor is not None
            retirement.reported = True
            self._send(retirement.supervisor, Free(retirement.order.plan_version))

    async def _watch_retirement(self) -> None:
        while True:
            await asyncio.sleep(FREE_CHECK_S)
            self._report_free()

    def load(self) -> CoreLoad:
        batcher = self.batcher
        return CoreLoad(
            pid=os.getpid(),
            accepting=batcher.accepting and not self._draining,
            queue_depth=batcher.queue_depth,
            active_rows=batcher.engine.active_rows,
        )

    def _submit(self, peer: bytes, message: Submit) -> None:
        try:
            sentences = self.batcher.put(
                [row.request() for row in message.rows], message.background
            )
        except Exception as error:  # QueueFull, NotAccepting: the whole request
            self._send(peer, failure_of(message.request_id, error))
            return
        if message.acknowledge:  # ahead of every RowsDone: one outbox, in order
            self._send(peer, Accepted(message.request_id))
        timeout_s = message.timeout_s
        deadline_s = None if timeout_s is None else timeout_s + DEADLINE_SLACK_S
        self.answers.follow(peer, message.request_id, sentences, deadline_s)

    # --- sending --------------------------------------------------------------------------

    def _send(self, peer: bytes, message: FromCore) -> None:
        self._outbox.put_nowait((peer, encode(message)))

    async def _write(self, router: zmq.asyncio.Socket) -> None:
        # one writer: sends from the readers and the step answers never interleave on the socket
        while True:
            peer, payload = await self._outbox.get()
            try:
                await router.send_multipart([peer, payload])
            except zmq.ZMQError as error:
                logger.warning("a reply to a front-end was not sent: %s", error)
            finally:
                self._outbox.task_done()


@dataclass(eq=False)
class Followed:
    """A request whose rows are answered to the front-end ``peer``."""

    peer: bytes
    request_id: int
    sentences: list[ScheduledSentence]
    deadline: asyncio.TimerHandle | None = None
    unanswered: int = field(init=False)

    def __post_init__(self) -> None:
        self.unanswered = len(self.sentences)


class RowAnswers:
    """The rows of every front-end's requests, answered once per engine step.

    The engine thread settles a step's results in one event-loop callback (``one_wakeup``,
    service/scheduling/sentences.py); each settled future queues its row here, and the first
    one schedules ``_flush`` behind the others, which then sends each front-end one
    ``RowsDone`` with all of them, then a ``Failed`` for each request a row of which failed
    (its other rows are dropped, as a client's timeout drops them)."""

    def __init__(self, batcher: ContinuousBatcher, send: Callable[[bytes, FromCore], None]) -> None:
        self._batcher = batcher
        self._send = send
        self._requests: dict[tuple[bytes, int], Followed] = {}
        self._settled: list[tuple[Followed, int, asyncio.Future[RowResult]]] = []
        self._flush_due = False

    def follow(
        self,
        peer: bytes,
        request_id: int,
        sentences: list[ScheduledSentence],
        deadline_s: float | None,
    ) -> None:
        """Answer ``sentences`` (a request's queued rows, in its order) to ``peer``; past
        ``deadline_s`` its unfinished rows are dropped and it fails with a timeout."""
        request = Followed(peer, request_id, sentences)
        key = (peer, request_id)
        self._requests[key] = request
        loop = asyncio.get_running_loop()
        if deadline_s is not None:
            request.deadline = loop.call_later(deadline_s, self._expire, key)
        for index, sentence in enumerate(sentences):
            sentence.future.add_done_callback(partial(self._row_settled, request, index))

    def peers(self) -> list[bytes]:
        """The front-ends with rows in flight here (one entry per request)."""
        return [peer for peer, _ in self._requests]

    def abort(self, peer: bytes, request_id: int) -> None:
        """Nobody waits for the request any more: its unfinished rows are dropped."""
        request = self._requests.get((peer, request_id))
        if request is not None:
            self._end(request)

    async def settled(self, timeout_s: float) -> None:
        """Until every followed request is answered (or ``timeout_s``): the drain's end."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while (self._requests or self._flush_due) and loop.time() < deadline:
            await asyncio.sleep(0.01)

    def _expire(self, key: tuple[bytes, int]) -> None:
        request = self._requests.get(key)
        if request is not None:
            self._end(request)
            self._send(request.peer, failure_of(request.request_id, TimeoutError()))

    def _row_settled(
        self, request: Followed, index: int, future: asyncio.Future[RowResult]
    ) -> None:
        if (
            future.cancelled()
            or self._requests.get((request.peer, request.request_id)) is not request
        ):
            return  # aborted, expired or failed meanwhile
        self._settled.append((request, index, future))
        if not self._flush_due:
            # behind the done-callbacks of the rest of the step's rows, already scheduled
            self._flush_due = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        settled, self._settled, self._flush_due = self._settled, [], False
        rows: dict[bytes, list[RowDone]] = {}
        failures: list[tuple[bytes, FromCore]] = []
        for request, index, future in settled:
            if self._requests.get((request.peer, request.request_id)) is not request:
                continue  # a row of it failed earlier in this flush
            if (error := future.exception()) is not None:
                self._end(request)
                failures.append((request.peer, failure_of(request.request_id, error)))
                continue
            rows.setdefault(request.peer, []).append(
                RowDone.of(request.request_id, index, future.result())
            )
            request.unanswered -= 1
            if not request.unanswered:
                self._forget(request)
        for peer, done in rows.items():
            self._send(peer, RowsDone(done))
        for peer, failed in failures:
            self._send(peer, failed)

    def _end(self, request: Followed) -> None:
        """The request leaves unanswered: its unfinished rows leave the queue or the batch."""
        self._forget(request)
        self._batcher.abandon(request.sentences)

    def _forget(self, request: Followed) -> None:
        self._requests.pop((request.peer, request.request_id), None)
        if request.deadline is not None:
            request.deadline.cancel()
