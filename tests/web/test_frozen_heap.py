"""The serving process's long-lived heap leaves the cyclic collector's full collections once
ready, is frozen again when the loaded models change, and is unfrozen at shutdown."""

from __future__ import annotations

import asyncio
import gc
import time

import pytest
from fastapi.testclient import TestClient

from service.config import Settings
from service.web import server
from service.web.frozen_heap import keep_frozen
from service.wiring import create_app
from tests.ready import wait_ready
from tests.service_fixtures import tiny_model


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return tiny_model(tmp_path_factory)


def collected(thing: object) -> bool:
    """Whether the collector still walks ``thing`` (a frozen object is in no generation)."""
    return any(candidate is thing for candidate in gc.get_objects())


def test_the_heap_is_frozen_again_when_the_models_change_and_unfrozen_when_stopped():
    loaded = ["model A"]
    old_model = ["weights of A"]

    async def serve_and_swap() -> list[bool]:
        watch = asyncio.create_task(keep_frozen(lambda: tuple(loaded), check_s=0.01))
        await asyncio.sleep(0.05)
        seen = [collected(old_model)]
        new_model = ["weights of B"]  # a newly loaded model: walked until the change is seen
        seen.append(collected(new_model))
        loaded[0] = "model B"
        await asyncio.sleep(0.05)
        seen.append(collected(new_model))
        watch.cancel()
        await asyncio.gather(watch, return_exceptions=True)
        seen.append(collected(new_model))
        return seen

    try:
        old_frozen, new_walked, new_frozen, after_stop = asyncio.run(serve_and_swap())
    finally:
        gc.unfreeze()
    assert (old_frozen, new_walked, new_frozen, after_stop) == (False, True, False, True)
    assert gc.get_freeze_count() == 0


def test_a_served_app_freezes_its_heap_once_ready_and_unfreezes_it_at_shutdown(model_dir, tmp_path):
    settings = Settings(
        exports=[model_dir], provider="cpu", intra_op_threads=1, data_dir=tmp_path / "data"
    )
    app = create_app(settings)
    app.state.service.freeze_heap = True  # as serve() sets it
    try:
        with TestClient(app) as client:
            wait_ready(client)
            deadline = time.monotonic() + 30
            while gc.get_freeze_count() == 0 and time.monotonic() < deadline:
                time.sleep(0.01)
            assert gc.get_freeze_count() > 0
            assert client.post("/v1/translate", json={"text": "Print"}).status_code == 200
        assert gc.get_freeze_count() == 0
    finally:
        gc.unfreeze()


def test_an_app_outside_the_server_leaves_the_heap_alone(model_dir, tmp_path):
    settings = Settings(
        exports=[model_dir], provider="cpu", intra_op_threads=1, data_dir=tmp_path / "data"
    )
    with TestClient(create_app(settings)) as client:
        wait_ready(client)
        time.sleep(0.1)
        assert gc.get_freeze_count() == 0


def test_the_server_turns_the_freeze_on(model_dir, tmp_path, monkeypatch):
    settings = Settings(exports=[model_dir], data_dir=tmp_path / "data")
    app = create_app(settings)
    monkeypatch.setattr(server.GracefulServer, "run", lambda self, sockets=None: None)
    server.serve(app, settings)
    assert app.state.service.freeze_heap is True
