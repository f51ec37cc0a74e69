"""When a loaded model is swapped for a new one: every ``MT_RELOAD_POLL_S`` the watch asks
its ``Freshness`` which loaded models are out of date and has the registry reload them
(``ModelRegistry.reload``: the new one loads beside the old, no request fails for the swap).

Out of date: in one process, a new revision that ``python -m service models update`` renamed
into its directory (``InstalledRevisions``); in a front-end, new engine cores the
supervisor's plan names (service/translation/plan_follower.py).
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
        self._stopped = False

    def watch(self) -> None:
        """From now on, every ``poll_s``, reload the loaded models that are out of date;
        until :meth:`stop`."""
        if self.poll_s > 0 and self._task is None and not self._stopped:
            self._task = asyncio.get_running_loop().create_task(self._watch())

    def stop(self) -> None:
        self._stopped = True
        if self._task is not None:
            self._task.cancel()

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(self.poll_s)
            await self.catch_up()

    async def catch_up(self) -> None:
        """Reload the loaded models that are out of date; say so once none is."""
        fresh, slots = self.freshness, self.slots
        fresh.refresh()
        for model_id, slot in list(slots.items()):
            if slot.state == "loaded" and fresh.outdated(slot):
                await self.reload(model_id)
        pending = [s for s in slots.values() if s.state in ("loading", "loaded")]
        if not any(s.state == "loading" or fresh.outdated(s) for s in pending):
            fresh.settled()
