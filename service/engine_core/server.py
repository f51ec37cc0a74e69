"""The engine core's side of the socket: a ZeroMQ ROUTER in front of one model replica's
``ContinuousBatcher``.

Every front-end connects a DEALER to the ROUTER, so the rows of every front-end's clients
meet in one queue and one running batch. The event loop here only relays: a ``Submit`` goes to
``submit_as_completed`` (a refusal answers at once with ``Failed``), and a task per request
sends a ``RowDone`` as each row finishes (after an ``Accepted`` where the submission asks); an ``Abort`` cancels that task, which drops the rows
still queued or running (as a client's timeout or hang-up does in process). The batcher's
engine thread does the work, as it does in the one-process service.

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

import msgspec
import zmq
import zmq.asyncio

from service.engine_core.protocol import (
    Abort,
    Accepted,
    CoreLoad,
    EngineCoreInfo,
    FromCore,
    Ping,
    Pong,
    RowDone,
    Submit,
    decode_to_core,
    encode,
    failure_of,
)
from service.scheduling.batcher import ContinuousBatcher
from service.scheduling.stream import RowStream

logger = logging.getLogger(__name__)

# How often the engine threads' CPU seconds are published to the shared metrics (a scrape of a
# front-end reads them from there).
PUBLISH_S = 1.0

# The engine core's own deadline for a request: the client's plus this. The client enforces
# its timeout itself and aborts; this only frees rows whose front-end died meanwhile.
DEADLINE_SLACK_S = 5.0

# How often the engine core looks whether its engine thread still runs.
WATCH_S = 0.1

# How long the socket, once closed, still sends the replies already queued on it (the last
# results and failures of a drain) to front-ends that are slow to read them.
LINGER_MS = 1000


def tuned(socket: zmq.Socket) -> None:
    """No high-water mark (a dropped message would be a row answered never) and no linger."""
    socket.setsockopt(zmq.SNDHWM, 0)
    socket.setsockopt(zmq.RCVHWM, 0)
    socket.setsockopt(zmq.LINGER, 0)


class EngineCoreServer:
    """Serves one batcher on ``address`` until ``stop``; ``serve`` returns whether it drained."""

    def __init__(self, batcher: ContinuousBatcher, info: EngineCoreInfo, address: str) -> None:
        self.batcher = batcher
        self.info = info
        self.address = address
        self._relays: dict[tuple[bytes, int], asyncio.Task[None]] = {}
        self._outbox: asyncio.Queue[tuple[bytes, bytes]] = asyncio.Queue()
        self._stop = asyncio.Event()
        self._draining = False
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
            if self._relays:
                await asyncio.wait(list(self._relays.values()), timeout=1.0)
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
            if isinstance(message, Submit):
                self._submit(peer, message)
            elif isinstance(message, Abort):
                relay = self._relays.get((peer, message.request_id))
                if relay is not None:
                    relay.cancel()
            elif isinstance(message, Ping):
                self._send(peer, Pong(message.sent_at, self.info, self.load()))

    def load(self) -> CoreLoad:
        batcher = self.batcher
        return CoreLoad(
            pid=os.getpid(),
            accepting=batcher.accepting and not self._draining,
            queue_depth=batcher.queue_depth,
            active_rows=batcher.engine.active_rows,
        )

    def _submit(self, peer: bytes, message: Submit) -> None:
        timeout_s = message.timeout_s
        try:
            stream = self.batcher.submit_as_completed(
                [row.request() for row in message.rows],
                None if timeout_s is None else timeout_s + DEADLINE_SLACK_S,
                message.background,
            )
        except Exception as error:  # QueueFull, NotAccepting: the whole request
            self._send(peer, failure_of(message.request_id, error))
            return
        if message.acknowledge:  # ahead of every RowDone: one outbox, in order
            self._send(peer, Accepted(message.request_id))
        key = (peer, message.request_id)
        self._relays[key] = asyncio.create_task(self._relay(key, stream))

    async def _relay(self, key: tuple[bytes, int], stream: RowStream) -> None:
        peer, request_id = key
        try:
            async for index, result in stream:
                self._send(peer, RowDone.of(request_id, index, result))
        except asyncio.CancelledError:
            pass  # aborted: closing the stream drops the unfinished rows
        except Exception as error:
            self._send(peer, failure_of(request_id, error))
        finally:
            stream.close()
            self._relays.pop(key, None)

    # --- sending --------------------------------------------------------------------------

    def _send(self, peer: bytes, message: FromCore) -> None:
        self._outbox.put_nowait((peer, encode(message)))

    async def _write(self, router: zmq.asyncio.Socket) -> None:
        # one writer: sends from many relay tasks never interleave on the socket
        while True:
            peer, payload = await self._outbox.get()
            try:
                await router.send_multipart([peer, payload])
            except zmq.ZMQError as error:
                logger.warning("a reply to a front-end was not sent: %s", error)
            finally:
                self._outbox.task_done()
