"""Many clients at once, against the real app, engine and tiny ONNX model.

A gate around the real engine lets a test hold decoder steps until the requests it needs are
queued, so every assertion is about step counts and results, never about wall time.

The overload tests (a full queue, a timeout, a client that hangs up, shutdown, a text at the
character limit) run in both process modes (``process_mode``): the gated engine in this
process's app, or behind the real engine-core server and a front-end's app
(tests/servers.py, ``serving_engine``).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Hashable
from contextlib import aclosing

import httpx
import pytest

from service.config import Settings
from service.runtime.engine import Engine
from service.runtime.groups import EncodedRequests
from service.runtime.step_cost import StepShape
from service.runtime.types import DecodeRequest, FinishedRequest, RejectedRequest
from service.text.tokenizer import Tokenizer
from service.translation.languages import LanguagePair
from service.translation.request import TranslationRequest
from service.web.deps import run_for_client
from service.web.errors import ApiError
from service.wiring import create_app
from tests.servers import asgi_client, serving_engine
from tests.service_fixtures import only_model, solo_translator, tiny_model

BASE_TEXTS = [
    "Save changes",
    "Open the file in a new window",
    "Delete all files",
    "Login",
    "Print this folder with your account",
    "Search and replace in all files of this folder",
    "Your password is not valid",
    "Close",
    "Cancel the changes to this file",
    "Copy",
    "Paste all files to the new folder",
    "Undo",
    "Edit the settings of your account",
    "New name",
    "Help about the tools",
    "Exit",
]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """The tiny exported model (built once per session)."""
    return tiny_model(tmp_path_factory)


class GatedEngine:
    """The real engine behind a gate: while closed, each decoder step waits for a permit.

    Records the step count at which each request joined and finished, and what was dropped.
    """

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self._gate = threading.Condition()
        self._closed = False  # guarded by _gate
        self._permits = 0  # guarded by _gate
        self.waiting = threading.Event()  # a step is waiting for a permit
        self.admitted_at: dict[Hashable, int] = {}
        self.src_ids: dict[Hashable, tuple[int, ...]] = {}
        self.finished_at: dict[Hashable, int] = {}
        self.dropped: list[Hashable] = []
        self.encoded_on: set[str] = set()  # threads that ran encode

    def __getattr__(self, name: str):
        return getattr(self._engine, name)

    def add(self, requests: list[DecodeRequest]) -> list[RejectedRequest]:
        for request in requests:
            self.admitted_at[request.request_id] = self._engine.steps
            self.src_ids[request.request_id] = tuple(request.src_ids)
        return self._engine.add(requests)

    def encode(self, requests: list[DecodeRequest]) -> EncodedRequests:
        """``add``'s first half (the batcher's encoder overlap): on the encoder thread."""
        self.encoded_on.update(threading.current_thread().name for _ in requests[:1])
        for request in requests:
            self.src_ids[request.request_id] = tuple(request.src_ids)
        return self._engine.encode(requests)

    def place(self, encoded: EncodedRequests) -> None:
        for request_id in encoded.request_ids:
            self.admitted_at[request_id] = self._engine.steps
        self._engine.place(encoded)

    def step(self) -> list[FinishedRequest]:
        with self._gate:
            while self._closed and self._permits == 0:
                self.waiting.set()
                self._gate.wait()
            self.waiting.clear()
            if self._closed:
                self._permits -= 1
        finished = self._engine.step()
        for done in finished:
            self.finished_at[done.request_id] = self._engine.steps
        return finished

    def drop(self, request_ids) -> None:
        request_ids = list(request_ids)
        self.dropped += [i for i in request_ids if i in self.admitted_at]
        self._engine.drop(request_ids)

    def close(self) -> None:
        with self._gate:
            self._closed, self._permits = True, 0

    def allow(self, steps: int) -> None:
        with self._gate:
            self._permits += steps
            self._gate.notify_all()

    def open(self) -> None:
        with self._gate:
            self._closed = False
            self._gate.notify_all()


def settings_for(model_dir, **overrides) -> Settings:
    """These tests pin admission by step counts: the cost-aware rule, which decides by
    measured timings, is off here (tests/scheduling/test_batcher_costs.py pins it on a deterministic cost)."""
    overrides.setdefault("admission_cost_aware", False)
    return Settings(exports=[model_dir], provider="cpu", intra_op_threads=1, **overrides)


async def wait_until(predicate, what: str) -> None:
    for _ in range(5000):
        if predicate():
            return
        await asyncio.sleep(0.002)
    raise AssertionError(f"never happened: {what}")


@pytest.fixture
def anyio_backend():
    return "asyncio"


@pytest.fixture
def gated_engine(model_dir):
    gate = GatedEngine(Engine.from_dir(model_dir, provider="cpu", intra_op_threads=1))
    yield gate
    gate.open()


@pytest.fixture(scope="module")
def solo(model_dir):
    return solo_translator(model_dir)


def id_of(gate: GatedEngine, text: str) -> Hashable:
    """The request id under which the engine saw ``text``."""
    src = tuple(Tokenizer.from_dir(gate.model_dir).encode_one(text))
    [request_id] = [i for i, ids in gate.src_ids.items() if ids == src]
    return request_id


@pytest.mark.anyio
async def test_64_concurrent_requests_each_get_what_they_get_alone(model_dir, gated_engine, solo):
    requests = [
        (f"{BASE_TEXTS[i % 16]} {BASE_TEXTS[(i * 5 + 3) % 16].lower()}" if i >= 16 else BASE_TEXTS[i], 4 + (i * 7) % 40)
        for i in range(64)
    ]  # fmt: skip
    # The 64 sources hold ~1,850 tokens (the tiny tokenizer spells all ASCII, so sources are
    # longer than they were): admission takes them all at once, without the step-cost gate
    # (tested on its own in test_batcher_costs.py), so the batch grows past 32 rows.
    app = create_app(
        settings_for(model_dir, admission_max_tokens=4096, admission_cost_aware=False),
        engine=gated_engine,
    )
    async with asgi_client(app) as client:
        gated_engine.close()
        batcher = only_model(app).batcher
        tasks = [
            asyncio.ensure_future(
                client.post("/v1/translate", json={"text": text, "max_new_tokens": tokens})
            )
            for text, tokens in requests
        ]
        await wait_until(
            lambda: batcher.queue_depth + gated_engine.active_requests == 64, "all 64 submitted"
        )
        gated_engine.open()
        responses = await asyncio.gather(*tasks)
        metrics = app.state.service.metrics.registry

    assert [r.status_code for r in responses] == [200] * 64
    got = [r.json()["translations"][0]["text"] for r in responses]
    assert got == [solo(text, tokens) for text, tokens in requests]
    lengths = {r.json()["translations"][0]["tokens"] for r in responses}
    assert len(lengths) > 5  # mixed lengths: rows left the batch at different steps
    steps = metrics.get_sample_value("mt_batch_rows_count")
    rows = metrics.get_sample_value("mt_batch_rows_sum")
    one_row_steps = metrics.get_sample_value("mt_batch_rows_bucket", {"le": "1.0"})
    assert rows / steps > 1 and one_row_steps < steps
    assert (
        metrics.get_sample_value("mt_batch_rows_bucket", {"le": "32.0"}) < steps
    )  # > 32 rows once


LONG_TEXT, SHORT_TEXT = "Print this folder with your account", "Login"


async def long_decode_then_a_newcomer(app, gated_engine, overlap: bool = False):
    """A long request decodes 5 gated steps; a short one is queued during its 6th; then the
    gate opens. Returns the step count at the start and both responses (long, short).

    ``overlap``: the batcher encodes newcomers on its encoder thread. Step 6 is let through
    alone; the newcomer is then encoded while step 7 waits at the gate, and the gate opens
    only once its encoder call is done, so it joins after step 7 however slowly the encoder
    thread is scheduled (no wall-time race with free-running steps)."""
    async with asgi_client(app) as client:
        gated_engine.close()
        batcher = only_model(app).batcher
        start = gated_engine.steps  # warm-up ran steps already
        long_task = asyncio.ensure_future(
            client.post("/v1/translate", json={"text": LONG_TEXT, "max_new_tokens": 60})
        )
        await wait_until(gated_engine.waiting.is_set, "long request decoding")
        gated_engine.allow(5)
        await wait_until(
            lambda: gated_engine.steps == start + 5 and gated_engine.waiting.is_set(), "5 steps"
        )
        short_task = asyncio.ensure_future(
            client.post("/v1/translate", json={"text": SHORT_TEXT, "max_new_tokens": 3})
        )
        await wait_until(lambda: batcher.queue_depth == 1, "short request queued")
        if overlap:
            gated_engine.allow(1)
            await wait_until(
                lambda: gated_engine.steps == start + 6 and gated_engine.waiting.is_set(),
                "step 6 done, step 7 waiting",
            )
            await wait_until(
                lambda: batcher.encoded_waiting_to_join, "newcomer encoded during step 7"
            )
        gated_engine.open()
        long_response, short_response = await asyncio.gather(long_task, short_task)
    return start, long_response, short_response


@pytest.mark.anyio
async def test_request_arriving_during_a_long_decode_is_admitted_before_it_ends(
    model_dir,
    gated_engine,
    solo,
):
    # exact step counts: the newcomer is encoded between two steps (no encoder overlap)
    app = create_app(settings_for(model_dir, encoder_overlap=False), engine=gated_engine)
    start, long_response, short_response = await long_decode_then_a_newcomer(app, gated_engine)

    long_id, short_id = id_of(gated_engine, LONG_TEXT), id_of(gated_engine, SHORT_TEXT)
    assert long_response.json()["translations"][0]["tokens"] == 60  # a long decode indeed
    assert gated_engine.admitted_at[long_id] == start
    assert gated_engine.finished_at[long_id] == start + 60
    # Queued during the long request's step 6, the short one joined right after it, and was
    # done long before the long one.
    assert gated_engine.admitted_at[short_id] == start + 6
    assert gated_engine.finished_at[short_id] <= start + 6 + 3 < gated_engine.finished_at[long_id]
    assert short_response.json()["translations"][0]["text"] == solo(SHORT_TEXT, 3)
    assert long_response.json()["translations"][0]["text"] == solo(LONG_TEXT, 60)


@pytest.mark.anyio
async def test_with_encoder_overlap_a_newcomer_is_encoded_while_the_long_decode_steps(
    model_dir, gated_engine, solo
):
    """The default: the newcomer's encoder call runs on the encoder thread while the running
    row takes its steps; it joins once encoded, and both translations are what they are
    alone."""
    app = create_app(settings_for(model_dir), engine=gated_engine)
    start, long_response, short_response = await long_decode_then_a_newcomer(
        app, gated_engine, overlap=True
    )

    long_id, short_id = id_of(gated_engine, LONG_TEXT), id_of(gated_engine, SHORT_TEXT)
    assert any(name.startswith("encoder") for name in gated_engine.encoded_on)
    # chosen after step 6, encoded while step 7 waited: joined right after step 7
    assert gated_engine.admitted_at[short_id] == start + 7
    assert gated_engine.finished_at[short_id] < gated_engine.finished_at[long_id] == start + 60
    assert short_response.json()["translations"][0]["text"] == solo(SHORT_TEXT, 3)
    assert long_response.json()["translations"][0]["text"] == solo(LONG_TEXT, 60)


@pytest.mark.anyio
async def test_full_queue_answers_429_with_retry_after(model_dir, gated_engine, process_mode):
    settings = settings_for(model_dir, max_queue=2, retry_after_s=3)
    async with serving_engine(process_mode, settings, gated_engine) as served:
        client, batcher = served.client, served.batcher
        gated_engine.close()
        running = asyncio.ensure_future(client.post("/v1/translate", json={"text": "Login"}))
        await wait_until(gated_engine.waiting.is_set, "engine busy")
        queued = [
            asyncio.ensure_future(client.post("/v1/translate", json={"text": text}))
            for text in ("Save", "Close")
        ]
        await wait_until(lambda: batcher.queue_depth == 2, "queue full")

        refused = await client.post("/v1/translate", json={"text": "Open"})
        assert refused.status_code == 429
        assert refused.headers["retry-after"] == "3"
        assert refused.json()["code"] == "queue_full"
        assert "MT_MAX_QUEUE=2" in refused.json()["error"]
        # More sentences than the whole queue: refused while others wait (an empty queue
        # would take it).
        too_big = await client.post("/v1/translate", json={"text": "Save. Open. Close."})
        assert too_big.status_code == 429 and "MT_MAX_QUEUE=2" in too_big.json()["error"]

        gated_engine.open()
        assert [r.status_code for r in await asyncio.gather(running, *queued)] == [200] * 3
        rejections = served.app.state.service.metrics.registry.get_sample_value(
            "mt_rejections_total", {"reason": "queue_full"}
        )
        assert rejections == 2


@pytest.mark.anyio
async def test_an_idle_server_takes_a_request_at_the_advertised_character_limit(
    model_dir, gated_engine, process_mode
):
    # 4,499 characters (under charLimit, 5,000) in 500 sentences: more than the 256 sentences
    # MT_MAX_QUEUE used to allow, and an idle queue must hold any request within the limits.
    async with serving_engine(process_mode, settings_for(model_dir), gated_engine) as served:
        settings = (await served.client.get("/frontend/settings")).json()
        text = ("Open it. " * 500).strip()
        assert len(text) <= settings["charLimit"]
        body = {"q": text, "source": "en", "target": "de"}
        response = await served.client.post("/translate", json=body)
        assert response.status_code == 200, response.text


@pytest.mark.anyio
async def test_three_concurrent_requests_near_the_character_limit_are_all_queued(
    model_dir, gated_engine
):
    """One process: four pastes at the limit at once, in both modes and with the front-end
    and the engine core in processes of their own, are tests/processes/test_both_modes.py's
    (here they would share one interpreter, whose lock a front-end tokenizing 2,000 sentences
    and an engine core admitting them hold for seconds on a loaded machine)."""
    app = create_app(settings_for(model_dir), engine=gated_engine)
    async with asgi_client(app) as client:
        gated_engine.close()  # nothing leaves the queue until all three have arrived
        batcher = only_model(app).batcher
        text = ("Open it. " * 478).strip()  # 4,301 characters, 478 sentences
        body = {"q": text, "source": "en", "target": "de"}
        requests = [asyncio.ensure_future(client.post("/translate", json=body)) for _ in range(3)]
        await wait_until(
            lambda: batcher.queue.arrived_rows == 3 * 478 or any(r.done() for r in requests),
            "all three queued",
        )
        gated_engine.open()
        responses = await asyncio.gather(*requests)
        assert [r.status_code for r in responses] == [200] * 3, [r.text for r in responses]


@pytest.mark.anyio
async def test_timeout_answers_504_and_drops_the_rows(model_dir, gated_engine, process_mode):
    settings = settings_for(model_dir, request_timeout_s=0.2)
    async with serving_engine(process_mode, settings, gated_engine) as served:
        gated_engine.close()
        response = await served.client.post("/v1/translate", json={"text": "Print this folder"})
        assert response.status_code == 504
        assert "MT_REQUEST_TIMEOUT_S=0.2" in response.json()["error"]
        gated_engine.open()
        await wait_until(lambda: gated_engine.dropped, "rows dropped")
        await wait_until(lambda: gated_engine.active_rows == 0, "the batch empty")
        assert gated_engine.finished_at == {}  # it never ran to the end
        again = await served.client.post("/v1/translate", json={"text": "Save"})
        assert again.status_code == 200


class HungUpRequest:
    """Stands in for a Starlette request, its body read, whose client hangs up once its rows
    are decoding: then its ``receive()`` says so, as uvicorn's does."""

    method, _body, _stream_consumed = "POST", b"{}", True

    def __init__(self, gate: GatedEngine) -> None:
        self.gate = gate

    async def receive(self) -> dict[str, str]:
        while not self.gate.waiting.is_set():
            await asyncio.sleep(0.002)
        return {"type": "http.disconnect"}


@pytest.mark.anyio
async def test_client_that_hangs_up_has_its_rows_dropped(model_dir, gated_engine, process_mode):
    settings = settings_for(model_dir)
    async with serving_engine(process_mode, settings, gated_engine) as served:
        gated_engine.close()
        translator = only_model(served.app).translator
        options = translator.limits.options(None, None)
        # Two sentences that decode for many steps (they run to their max_new_tokens).
        text = "Print this folder with your account. Open the file in a new window."
        request = TranslationRequest([text], LanguagePair.parse("en", "de"), options)

        async def translate() -> object:
            async with aclosing(await translator.translate(request)) as items:
                return [item async for item in items][-1]

        work = translate()
        with pytest.raises(ApiError) as refusal:
            await run_for_client(HungUpRequest(gated_engine), served.app.state.service, work)
        assert refusal.value.status == 499
        gated_engine.open()
        await wait_until(lambda: len(gated_engine.dropped) == 2, "both sentences dropped")
        await wait_until(lambda: gated_engine.active_rows == 0, "the batch empty")
        assert served.batcher.queue_depth == 0
        assert gated_engine.finished_at == {}


@pytest.mark.anyio
async def test_shutdown_refuses_new_work_and_finishes_what_is_in_flight(
    model_dir, gated_engine, process_mode
):
    """SIGTERM's drain of the process that holds the HTTP socket (the one process, or a
    front-end). A front-end's engine core drains on its own SIGTERM:
    ``test_an_engine_core_drains_what_it_holds_and_then_closes``."""
    async with serving_engine(process_mode, settings_for(model_dir), gated_engine) as served:
        client = served.client
        gated_engine.close()
        in_flight = asyncio.ensure_future(client.post("/v1/translate", json={"text": "Login"}))
        await wait_until(gated_engine.waiting.is_set, "decoding")
        served.app.state.service.begin_shutdown()  # what SIGTERM does (service/web/server.py)

        refused = await client.post("/v1/translate", json={"text": "Save"})
        assert refused.status_code == 503 and refused.headers["retry-after"] == "1"
        assert "shutting down" in refused.json()["error"]
        assert (await client.get("/ready")).status_code == 503
        gated_engine.open()
        assert (await in_flight).status_code == 200
        batcher = only_model(served.app).batcher
        if process_mode == "multi":
            assert served.core is not None and served.core.serving
    # the lifespan's shutdown stopped the engine loop (one process) or closed the
    # front-end's sockets to its engine cores (multi: they drain on their own SIGTERM)
    assert not batcher.alive if process_mode == "multi" else not batcher._thread.is_alive()


@pytest.mark.anyio
async def test_an_engine_core_drains_what_it_holds_and_then_closes(model_dir, gated_engine):
    """Multi-process only: SIGTERM to an engine core (the supervisor's, after its front-ends
    drained) refuses new rows and finishes those it holds within the grace."""
    async with serving_engine("multi", settings_for(model_dir), gated_engine) as served:
        core = served.core
        assert core is not None
        gated_engine.close()
        in_flight = asyncio.ensure_future(
            served.client.post("/v1/translate", json={"text": "Login"})
        )
        await wait_until(gated_engine.waiting.is_set, "decoding")
        stopping = asyncio.ensure_future(asyncio.to_thread(core.stop))
        await wait_until(lambda: not served.batcher.accepting, "the engine core drains")
        refused = await served.client.post("/v1/translate", json={"text": "Save"})
        assert refused.status_code == 503 and "retry-after" in refused.headers
        gated_engine.open()
        assert (await in_flight).status_code == 200
        await stopping
        assert core.drained is True and not core.serving


class SlowWarmup:
    """An engine whose warm-up waits for the test."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self.release = threading.Event()

    def __getattr__(self, name: str):
        return getattr(self._engine, name)

    def warmup(self) -> None:
        self.release.wait()
        self._engine.warmup()


@pytest.mark.anyio
async def test_not_ready_until_warmed_up(model_dir):
    engine = SlowWarmup(Engine.from_dir(model_dir, provider="cpu", intra_op_threads=1))
    app = create_app(settings_for(model_dir), engine=engine)
    try:
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://mt") as client:
                assert (await client.get("/health")).status_code == 200
                ready = await client.get("/ready")
                assert ready.status_code == 503 and ready.json()["status"] == "loading"
                refused = await client.post("/v1/translate", json={"text": "Save"})
                assert refused.status_code == 503 and "retry-after" in refused.headers
                engine.release.set()
                await wait_until(lambda: app.state.service.phase == "ready", "ready")
                assert (
                    await client.post("/v1/translate", json={"text": "Save"})
                ).status_code == 200
    finally:
        engine.release.set()


@pytest.mark.anyio
async def test_cost_aware_service_calibrates_its_step_cost_at_start_up(model_dir):
    engine = Engine.from_dir(model_dir, provider="cpu", intra_op_threads=1)
    assert not engine.step_cost.fitted
    app = create_app(settings_for(model_dir, admission_cost_aware=True), engine=engine)
    async with asgi_client(app) as client:
        response = await client.post("/v1/translate", json={"text": "Save changes"})
        batcher = only_model(app).batcher
    assert response.status_code == 200
    assert engine.step_cost.fitted and batcher.config.admission_cost_aware
    assert engine.step_cost.predict(StepShape(8, 4, 8)) > 0
