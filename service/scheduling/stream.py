"""Results of one ``submit`` call, all at once (``all_rows``), or of one
``submit_as_completed`` call, in the order its sentences finish (``RowStream``)."""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from typing import Protocol

from service.scheduling.sentences import RowResult, ScheduledSentence


class Abandons(Protocol):
    def abandon(self, sentences: Sequence[ScheduledSentence]) -> None: ...


async def all_rows(
    batcher: Abandons, sentences: list[ScheduledSentence], timeout_s: float | None
) -> list[RowResult]:
    """Every row's result, in the order of ``sentences``. On timeout (``TimeoutError``) or
    cancellation (client gone) the unfinished rows are abandoned."""
    try:
        async with asyncio.timeout(timeout_s):
            if len(sentences) == 1:  # most requests: no gathering future around the one
                return [await sentences[0].future]
            return list(await asyncio.gather(*(s.future for s in sentences)))
    except BaseException:
        batcher.abandon(sentences)
        raise


class RowStream:
    """Results of one :meth:`ContinuousBatcher.submit_as_completed` call as rows finish.

    An async iterator with ``aclose()`` (use ``contextlib.aclosing``): closing it before the
    end abandons the unfinished rows, whether or not iteration ever started.

    ``accepted``: where the rows are queued elsewhere (an engine core), waits until they are
    and raises its refusal; :meth:`started` awaits it.
    """

    def __init__(
        self,
        batcher: Abandons,
        sentences: list[ScheduledSentence],
        timeout_s: float | None,
        accepted: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        self._batcher = batcher
        self._sentences = sentences
        self._accepted = accepted
        self._deadline = None if timeout_s is None else time.monotonic() + timeout_s
        self._index_of = {s.future: index for index, s in enumerate(sentences)}
        self._pending: set[asyncio.Future[RowResult]] = set(self._index_of)
        self._ready: deque[asyncio.Future[RowResult]] = deque()

    def __aiter__(self) -> RowStream:
        return self

    async def started(self) -> None:
        """Once the rows are queued: at once in this process; with an engine core, when it
        has taken them. Its refusal (a full queue) raises here, before a response starts,
        and the rows are abandoned."""
        if self._accepted is None:
            return
        wait_s = None if self._deadline is None else self._deadline - time.monotonic()
        try:
            async with asyncio.timeout(wait_s):
                await self._accepted()
        except BaseException:
            self.close()
            raise

    async def __anext__(self) -> tuple[int, RowResult]:
        try:
            while not self._ready:
                if not self._pending:
                    raise StopAsyncIteration
                wait_s = None if self._deadline is None else self._deadline - time.monotonic()
                if wait_s is not None and wait_s <= 0:
                    raise TimeoutError
                done, self._pending = await asyncio.wait(
                    self._pending, timeout=wait_s, return_when=asyncio.FIRST_COMPLETED
                )
                # Several may finish in one step (or while the consumer was busy): hand them
                # out in the order they finished.
                self._ready.extend(sorted(done, key=self._finish_order))
            future = self._ready.popleft()
            return self._index_of[future], future.result()
        except StopAsyncIteration:
            raise
        except BaseException:
            self.close()
            raise

    def _finish_order(self, future: asyncio.Future[RowResult]) -> tuple[int, int]:
        step = -1 if future.exception() is not None else future.result().finished_step
        return step, self._index_of[future]

    def close(self) -> None:
        """Abandon the rows that have not finished (no-op once all have)."""
        if self._pending:
            self._pending = set()
            self._batcher.abandon(self._sentences)

    async def aclose(self) -> None:
        self.close()
