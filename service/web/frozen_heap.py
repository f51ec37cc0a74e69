"""The serving process's long-lived objects kept out of the cyclic garbage collector's full
collections.

Once the models, the tokenizers and the language detector are loaded, the process holds
about 100,000 objects that live as long as it does. Requests allocate and free containers
all the time, and every few thousand requests the collector's oldest generation is due: a
full collection walks every one of those objects, about 100 ms on the event loop's thread
(measured under load), during which no request is answered. ``gc.freeze()`` moves the
objects alive at that moment into a permanent generation that collections skip; requests'
objects are collected as before.

A frozen object that later becomes cyclic garbage is never collected, so the heap is frozen
again whenever the loaded models change (a model loaded, unloaded or swapped for a new
revision): unfrozen, collected, frozen. At shutdown everything is unfrozen.
"""

from __future__ import annotations

import asyncio
import gc
import logging
from collections.abc import Callable, Hashable

logger = logging.getLogger(__name__)

# How often the loaded models are compared with those frozen: a model's objects that turned
# to garbage wait at most this long (plus one full collection) to be collected.
CHECK_S = 5.0


def freeze() -> None:
    """Collect what is garbage now, then freeze everything left."""
    gc.collect()
    gc.freeze()


async def keep_frozen(loaded: Callable[[], Hashable], check_s: float = CHECK_S) -> None:
    """Freeze the heap now, and again each time ``loaded()`` (which models are loaded)
    changes; until cancelled, when the heap is unfrozen."""
    try:
        frozen = loaded()
        freeze()
        logger.debug("heap frozen: %d objects", gc.get_freeze_count())
        while True:
            await asyncio.sleep(check_s)
            if (now := loaded()) != frozen:
                gc.unfreeze()
                frozen = now
                freeze()
                logger.debug("loaded models changed; heap frozen again")
    finally:
        gc.unfreeze()
