"""When a loaded model is swapped for a new one: the watch asks its ``Freshness`` which
loaded models are out of date and has the registry reload them (``ModelRegistry.reload``: the
new one loads beside the old, no request fails for the swap).

Out of date: in one process, a new revision that ``python -m service models update`` renamed
into its directory (``InstalledRevisions``, looked at every ``MT_RELOAD_POLL_S``); in a
front-end, new engine cores the supervisor's plan names (service/translation/plan_follower.py),
which a retired engine core's pong tells at once (``wake``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping

from service.translation.slots import Freshness, ModelSlot

# Swaps a loaded model for a new one of itself (``ModelRegistry.reload``); whether it did.
Reload = Callable[[str], Awaitable[bool]]


class RevisionWatch:
    """The registry's watch for out-of-date models, started once the models are ready."""

    def __init__(
        self, slots: Mapping[str, ModelSlot], reload: Reload, freshness: Freshness, poll_s: float
    ) -> None:
        """``slots``: the registry's models; ``poll_s``: how often it looks (0: never)."""
        self.slots = slots
        self.reload = reload
        self.freshness = freshness
        self.poll_s = poll_s
        self._task: asyncio.Task[None] | None = None
        self._woken: asyncio.Task[None] | None = None
        self._again = False
        self._stopped = False
        # one catch-up at a time: the poll's and a wake's would both see a model out of date
        # while the first reloads it, and load it twice
        self._catching_up = asyncio.Lock()

    def watch(self) -> None:
        """From now on, every ``poll_s``, reload the loaded models that are out of date;
        until :meth:`stop`."""
        if self.poll_s > 0 and self._task is None and not self._stopped:
            self._task = asyncio.get_running_loop().create_task(self._watch())

    def wake(self) -> None:
        """Catch up now, not at the next poll (on the event loop); once more after a catch-up
        under way."""
        if self._stopped:
            return
        self._again = True
        if self._woken is None or self._woken.done():
            self._woken = asyncio.get_running_loop().create_task(self._catch_up_while_woken())

    async def _catch_up_while_woken(self) -> None:
        while self._again and not self._stopped:
            self._again = False
            await self.catch_up()

    def stop(self) -> None:
        self._stopped = True
        for task in (self._task, self._woken):
            if task is not None:
                task.cancel()

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(self.poll_s)
            await self.catch_up()

    async def catch_up(self) -> None:
        """Reload the loaded models that are out of date."""
        async with self._catching_up:
            for model_id, slot in list(self.slots.items()):
                if slot.state == "loaded" and self.freshness.outdated(slot):
                    await self.reload(model_id)
