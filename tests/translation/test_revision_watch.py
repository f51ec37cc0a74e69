"""The registry's watch for out-of-date models (service/translation/revisions.py): a wake (a
front-end's client heard its model move) swaps the model at once, and a wake arriving while
the poll's catch-up reloads it does not load it a second time."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest

from service.translation.revisions import RevisionWatch


@pytest.fixture
def anyio_backend():
    return "asyncio"


class Moved:
    """Freshness: a model is out of date until it was reloaded onto ``where``."""

    def __init__(self) -> None:
        self.where = "old"

    def outdated(self, slot: Any) -> bool:
        return slot.where != self.where


@pytest.mark.anyio
async def test_a_wake_during_a_catch_up_reloads_the_model_once():
    slot = SimpleNamespace(state="loaded", where="old")
    freshness = Moved()
    reloads: list[str] = []
    loading = asyncio.Event()

    async def reload(model_id: str) -> bool:
        reloads.append(model_id)
        loading.set()
        await asyncio.sleep(0.05)  # the new model loads
        slot.where = freshness.where
        return True

    watch = RevisionWatch({"m": slot}, reload, freshness, poll_s=0)  # type: ignore[dict-item]
    freshness.where = "new"
    polled = asyncio.create_task(watch.catch_up())  # the poll's
    await loading.wait()
    watch.wake()  # the client's, while the poll's reload runs
    watch.wake()
    await polled
    await asyncio.sleep(0.1)
    assert reloads == ["m"] and slot.where == "new"
    freshness.where = "newer"
    watch.wake()  # nothing polls (poll_s 0): the wake alone swaps it
    await asyncio.sleep(0.1)
    assert reloads == ["m", "m"] and slot.where == "newer"
    watch.stop()
