"""Many models in one process: routing by pair, pivoting, language detection, lazy loading
and eviction, fair turns between models, and the real LibreTranslate client.

Three tiny models (en→de, de→en, en→fr; tests/service_fixtures.py) from the real export run
on the real engine, so every translation can be compared with what that model gives alone.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections.abc import Hashable
from functools import partial
from types import SimpleNamespace

import httpx
import pytest
from fastapi.testclient import TestClient

from service.config import Settings
from service.metrics import ServiceMetrics
from service.runtime.types import BatchEstimate, DecodeRequest, FinishedRequest
from service.scheduling.batcher import ContinuousBatcher
from service.scheduling.settings import BatchingSettings
from service.scheduling.turns import RoundRobinTurns
from service.translation.languages import LanguagePair
from service.translation.routing import UnsupportedLanguage, plan_route, targets_by_source
from service.wiring import create_app
from tests.service_fixtures import language_models, solo_translator

MAX_NEW = 12  # every request here fixes max_new_tokens, so solo references can match it
ENGLISH = "Open the file in a new window"
GERMAN = "Öffnen Sie die Datei in einem neuen Fenster"


@pytest.fixture
def anyio_backend():
    return "asyncio"


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory):
    return language_models(tmp_path_factory)


def settings_for(model_dirs, **overrides) -> Settings:
    base = dict(
        exports=list(model_dirs.values()),
        provider="cpu",
        intra_op_threads=1,
        max_queue=64,
        retry_after_s=2,
    )
    return Settings(**{**base, **overrides})


def wait_ready(client: TestClient) -> None:
    for _ in range(600):
        if client.get("/ready").status_code == 200:
            return
        time.sleep(0.05)
    raise AssertionError(f"never ready: {client.get('/ready').json()}")


@pytest.fixture(scope="module")
def client(model_dirs):
    with TestClient(create_app(settings_for(model_dirs))) as test_client:
        wait_ready(test_client)
        yield test_client


@pytest.fixture(scope="module")
def solo(model_dirs):
    """(source, target) -> the model's translation of one sentence alone."""
    return {pair: solo_translator(path) for pair, path in model_dirs.items()}


def translate(client, text, source=None, target=None, **extra) -> httpx.Response:
    body = {"text": text, "max_new_tokens": MAX_NEW, **extra}
    if source is not None:
        body["source_lang"] = source
    if target is not None:
        body["target_lang"] = target
    return client.post("/v1/translate", json=body)


# --- registry and routing --------------------------------------------------------------------


def test_models_lists_every_pair_with_its_state_provider_and_memory(client):
    cards = {card["id"]: card for card in client.get("/v1/models").json()["data"]}
    assert set(cards) == {"tiny-en-de", "tiny-de-en", "tiny-en-fr"}
    for model_id, card in cards.items():
        assert f"tiny-{card['source_lang']}-{card['target_lang']}" == model_id
        assert card["state"] == "loaded" and card["ready"] and card["provider"] == "cpu"
        assert card["weights_bytes"] > 100_000  # encoder + decoder graphs of the tiny model
        assert card["memory_bytes"] is not None


def test_requests_route_to_the_model_of_their_pair(client, solo):
    text = "Save changes"
    outputs = {}
    for source, target in (("en", "de"), ("en", "fr")):
        response = translate(client, text, source, target)
        assert response.status_code == 200, response.text
        body = response.json()
        assert body["models"] == [f"tiny-{source}-{target}"]
        assert body["translations"][0]["models"] == [f"tiny-{source}-{target}"]
        assert body["translations"][0]["source_lang"] == source
        assert response.headers["x-translation-models"] == f"tiny-{source}-{target}"
        assert body["translations"][0]["text"] == solo[(source, target)](text, MAX_NEW)
        outputs[target] = body["translations"][0]["text"]
    assert outputs["de"] != outputs["fr"]  # two different models ran
    response = translate(client, GERMAN, "de", "en")
    assert response.json()["models"] == ["tiny-de-en"]
    assert response.json()["translations"][0]["text"] == solo[("de", "en")](GERMAN, MAX_NEW)


def test_pivot_de_fr_runs_de_en_then_en_fr_sentence_by_sentence(client, solo):
    sentences = ["Öffnen Sie die Datei.", "Alle Änderungen speichern."]
    text = "  ".join(sentences)
    response = translate(client, text, "de", "fr")
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["models"] == ["tiny-de-en", "tiny-en-fr"]
    assert body["model"] == "tiny-de-en+tiny-en-fr"
    # Each translation says where it came from, as a direct one does.
    [translation] = body["translations"]
    assert translation["source_lang"] == "de"
    assert translation["models"] == ["tiny-de-en", "tiny-en-fr"]
    english = [solo[("de", "en")](sentence, MAX_NEW) for sentence in sentences]
    print(
        "LEGS",
        [ascii(leg) for leg in english],
        ascii(body["translations"][0]["text"]),
        body["usage"],
    )
    assert all(any(c.isalnum() for c in leg) for leg in english)  # both legs decode
    french = [solo[("en", "fr")](leg, MAX_NEW) for leg in english]
    assert body["translations"][0]["text"] == "  ".join(french)
    # Two sentences, two legs each, except that the tiny de→en model's first English leg,
    # "(((((((((((Öffnen", has nothing left to translate once the word it cannot spell is
    # protected (service/text/protection.py): it passes through the second leg unchanged.
    assert english[0].startswith("(") and "Öffnen" in english[0]
    assert body["usage"]["sentences"] == 3


def test_a_direct_model_wins_over_a_pivot():
    models = {("de", "en"): "de-en", ("en", "fr"): "en-fr", ("de", "fr"): "de-fr"}
    de_fr = LanguagePair.parse("de", "fr")
    assert plan_route(de_fr, models, "en").legs == ("de-fr",)
    del models[("de", "fr")]
    assert plan_route(de_fr, models, "en").legs == ("de-en", "en-fr")
    with pytest.raises(UnsupportedLanguage):
        plan_route(de_fr, models, "")  # pivoting off


def test_languages_lists_direct_and_pivot_targets(client):
    assert client.get("/languages").json() == [
        {"code": "de", "name": "German", "targets": ["en", "fr"]},
        {"code": "en", "name": "English", "targets": ["de", "fr"]},
        {"code": "fr", "name": "French", "targets": []},
    ]
    assert targets_by_source([("en", "de")], "en") == {"de": [], "en": ["de"]}


def test_same_source_and_target_returns_the_text_and_runs_no_model(client):
    body = translate(client, "Save changes", "en", "en").json()
    assert body["translations"][0]["text"] == "Save changes" and body["models"] == []
    # ... and says so, where a translation that happens to equal its source does not.
    assert body["translations"][0]["unchanged"] is True
    assert (
        translate(client, "Save changes", "en", "de").json()["translations"][0]["unchanged"]
        is False
    )
    libre = client.post("/translate", json={"q": "Save changes", "source": "en", "target": "en"})
    assert libre.status_code == 200 and libre.json()["translatedText"] == "Save changes"


@pytest.mark.parametrize(
    ("source", "target", "code", "message"),
    [
        ("fr", "de", "unsupported_pair", "German (de) is not available as a target language from French (fr)"),
        ("xx", "de", "unsupported_language", "xx is not supported"),
        ("en", "zz", "unsupported_language", "zz is not supported"),
    ],
)  # fmt: skip
def test_unsupported_pairs_are_400_with_libretranslate_texts(client, source, target, code, message):
    response = client.post("/translate", json={"q": "Hallo", "source": source, "target": target})
    assert response.status_code == 400
    assert response.json() == {"error": message, "code": code}
    assert translate(client, "Hallo", source, target).json()["error"] == message


def test_missing_target_with_several_choices_is_400(client):
    response = translate(client, "Save changes", "en")
    assert response.status_code == 400
    assert response.json()["error"] == "Invalid request: missing target parameter"
    # German has one direct target: it is the default.
    assert translate(client, GERMAN, "de").json()["models"] == ["tiny-de-en"]


def test_no_target_for_a_source_nothing_translates_from_names_the_source(client):
    """Without a target, a source no model translates from (as detection finds for a text in
    another language) is refused naming it, not as a missing target."""
    spanish = translate(client, "Hallo", "es")
    assert spanish.status_code == 400
    assert spanish.json() == {"error": "es is not supported", "code": "unsupported_language"}
    french = translate(client, "Bonjour", "fr")  # served only as a target here
    assert french.status_code == 400
    assert french.json()["error"] == "French (fr) is not available as a source language"


# --- language detection ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "language", "target", "model"),
    [(ENGLISH, "en", "de", "tiny-en-de"), (GERMAN, "de", "en", "tiny-de-en")],
)
def test_auto_source_is_detected_and_routed(client, solo, text, language, target, model):
    for source in (None, "auto"):
        body = translate(client, text, source, target).json()
        assert body["source_lang"] == language and body["models"] == [model]
        assert body["detected_language"]["language"] == language
        assert body["detected_language"]["confidence"] > 90
        assert body["translations"][0]["text"] == solo[(language, target)](text, MAX_NEW)
    response = client.post(
        "/translate", json={"q": [text, text], "source": "auto", "target": target}
    )
    detected = response.json()["detectedLanguage"]
    assert len(detected) == 2 and detected[0] == detected[1]
    assert detected[0]["language"] == language and set(detected[0]) == {"language", "confidence"}


GERMAN_TOO = "Alle Änderungen speichern und das Fenster schließen"


@pytest.mark.parametrize(
    ("target", "models"),
    [
        ("fr", {"en": ["tiny-en-fr"], "de": ["tiny-de-en", "tiny-en-fr"]}),  # direct, pivot
        ("de", {"en": ["tiny-en-de"], "de": []}),  # German to German: returned as it is
    ],
)
def test_a_detected_list_gives_what_each_text_gives_alone(client, target, models):
    texts = [GERMAN, ENGLISH, GERMAN_TOO]
    alone = [translate(client, text, None, target).json() for text in texts]
    assert [body["source_lang"] for body in alone] == ["de", "en", "de"]
    response = translate(client, texts, None, target)
    assert response.status_code == 200, response.text
    body = response.json()
    for text, single, translation in zip(texts, alone, body["translations"], strict=True):
        assert translation["text"] == single["translations"][0]["text"], text
        language = single["source_lang"]
        assert translation["source_lang"] == language
        assert translation["detected_language"] == single["detected_language"]
        assert translation["models"] == models[language] == single["models"]
    # The top level describes the first text; every model that ran is named.
    assert body["source_lang"] == "de" and body["detected_language"]["language"] == "de"
    ran = list(dict.fromkeys(models["de"] + models["en"]))
    assert body["models"] == ran
    assert response.headers["x-translation-models"] == ",".join(ran)
    # Each text's detection in the headers too, in input order.
    detections = [t["detected_language"] for t in body["translations"]]
    assert response.headers["x-detected-language"] == ",".join(d["language"] for d in detections)
    confidences = response.headers["x-detected-language-confidence"].split(",")
    assert [float(c) for c in confidences] == [d["confidence"] for d in detections]
    given = translate(client, texts, "de", target)
    assert "x-detected-language" not in given.headers  # nothing was detected
    assert "x-detected-language-confidence" not in given.headers
    # The stream detects text by text too, and ends with the same translations.
    with client.stream(
        "POST",
        "/v1/translate/stream",
        json={"text": texts, "target_lang": target, "max_new_tokens": MAX_NEW},
    ) as streamed:
        lines = [line for line in streamed.iter_lines() if line.startswith("data: {")]
    done = json.loads(lines[-1].removeprefix("data: "))
    assert [t["text"] for t in done["translations"]] == [t["text"] for t in body["translations"]]


def test_libretranslate_keeps_one_detection_per_request(client):
    response = client.post(
        "/translate", json={"q": [GERMAN, ENGLISH, GERMAN_TOO], "source": "auto", "target": "fr"}
    )
    assert response.status_code == 200, response.text
    detected = response.json()["detectedLanguage"]
    assert len(detected) == 3 and detected[0] == detected[1] == detected[2]
    assert response.headers["x-translation-models"] in ("tiny-en-fr", "tiny-de-en,tiny-en-fr")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (GERMAN, "de"),
        ("42 !", "de"),
        (ENGLISH, "en"),
        ("Bonjour à tous, comment allez-vous?", "fr"),
    ],
)
def test_one_served_language_answers_its_texts_and_names_the_language_of_others(text, expected):
    """With one served source language, its texts (and texts without letters) are that
    language unscored; a text that is surely in another language is that language, so that the
    request is refused naming it rather than translated as the served one."""
    from service.translation.detection import LanguageDetector

    [best, *_] = LanguageDetector(["de"]).detect(text)
    assert best.language == expected
    if expected == "de":
        assert best.confidence == (100.0 if any(char.isalpha() for char in text) else 0.0)


def test_detect_ranks_the_served_source_languages(client):
    response = client.post("/detect", data={"q": GERMAN})
    assert response.status_code == 200
    detections = response.json()
    assert [d["language"] for d in detections] == ["de", "en"]  # fr is only a target
    assert detections[0]["confidence"] > 90 >= detections[1]["confidence"]
    assert client.post("/detect", json={}).json()["error"] == (
        "Invalid request: missing q parameter"
    )


@pytest.mark.parametrize(
    "kwargs", [{"json": {"q": ""}}, {"json": {"q": []}}, {"data": {"q": ""}}, {"json": {}}]
)
def test_detect_without_text_is_400_with_libretranslate_text(client, kwargs):
    # LibreTranslate's /detect: `if not q: abort(400, "Invalid request: missing q parameter")`.
    response = client.post("/detect", **kwargs)
    assert response.status_code == 400
    assert response.json()["error"] == "Invalid request: missing q parameter"


def test_each_models_batcher_writes_its_own_queue_and_inflight_gauges():
    metrics = ServiceMetrics()
    en_de, en_fr = metrics.for_model("en-de"), metrics.for_model("en-fr")
    en_de.queue_depth.set(3)
    en_fr.queue_depth.set(7)
    en_de.inflight_rows.set(32)
    en_fr.decode_steps.inc()  # counters and histograms stay shared
    sample = metrics.registry.get_sample_value
    assert sample("mt_queue_depth", {"model": "en-de"}) == 3
    assert sample("mt_queue_depth", {"model": "en-fr"}) == 7
    assert sample("mt_inflight_rows", {"model": "en-de"}) == 32
    assert sample("mt_inflight_rows", {"model": "en-fr"}) == 0
    assert sample("mt_decode_steps_total") == 1
    metrics.forget_model("en-de")
    assert sample("mt_queue_depth", {"model": "en-de"}) is None
    assert sample("mt_inflight_rows", {"model": "en-de"}) is None
    assert sample("mt_queue_depth", {"model": "en-fr"}) == 7


def test_metrics_list_queue_and_inflight_gauges_for_every_loaded_model(client):
    assert translate(client, "Save changes", "en", "fr").status_code == 200
    text = client.get("/metrics").text
    for model_id in ("tiny-en-de", "tiny-de-en", "tiny-en-fr"):
        assert f'mt_queue_depth{{model="{model_id}"}}' in text
        assert f'mt_inflight_rows{{model="{model_id}"}}' in text


# --- lazy loading and eviction ---------------------------------------------------------------


def states(client) -> dict[str, str]:
    return {card["id"]: card["state"] for card in client.get("/v1/models").json()["data"]}


def wait_for(predicate, what: str) -> None:
    for _ in range(600):
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError(f"never happened: {what}")


def test_lazy_loading_waits_for_the_load_and_evicts_the_least_recently_used(model_dirs, solo):
    settings = settings_for(model_dirs, lazy_load=True, max_loaded_models=1)
    with TestClient(create_app(settings)) as lazy:
        wait_ready(lazy)
        assert set(states(lazy).values()) == {"unloaded"}
        response = translate(lazy, "Save changes", "en", "de")
        assert response.status_code == 200
        assert response.json()["translations"][0]["text"] == solo[("en", "de")](
            "Save changes", MAX_NEW
        )
        assert states(lazy) == {
            "tiny-en-de": "loaded",
            "tiny-de-en": "unloaded",
            "tiny-en-fr": "unloaded",
        }
        assert translate(lazy, "Save changes", "en", "fr").status_code == 200
        assert states(lazy) == {
            "tiny-en-de": "unloaded",
            "tiny-de-en": "unloaded",
            "tiny-en-fr": "loaded",
        }
        # A pivot needs two models at once: the bound gives way while it runs, and the least
        # recently used of the two is unloaded when it is done.
        response = translate(lazy, GERMAN, "de", "fr")
        assert response.json()["models"] == ["tiny-de-en", "tiny-en-fr"]
        wait_for(lambda: list(states(lazy).values()).count("loaded") == 1, "trimmed to 1")
        assert states(lazy)["tiny-en-fr"] == "loaded"
        evictions = lazy.app.state.service.metrics.registry.get_sample_value(
            "mt_model_evictions_total"
        )
        assert evictions == 3  # en-de, en-fr (for de-en), de-en (trim)
        # Unloaded models leave /metrics; the loaded one keeps its gauges. A slot reads
        # "unloaded" as its unload begins, and its gauges go once its batcher has shut down.
        sample = lazy.app.state.service.metrics.registry.get_sample_value
        wait_for(
            lambda: all(
                sample(gauge, {"model": model_id}) is None
                for gauge in ("mt_queue_depth", "mt_inflight_rows")
                for model_id in ("tiny-en-de", "tiny-de-en")
            ),
            "the unloaded models' gauges leave /metrics",
        )
        assert sample("mt_queue_depth", {"model": "tiny-en-fr"}) is not None


def test_cold_start_reject_answers_503_with_retry_after_while_loading(model_dirs):
    settings = settings_for(model_dirs, lazy_load=True, cold_start="reject")
    with TestClient(create_app(settings)) as lazy:
        wait_ready(lazy)
        response = translate(lazy, "Save changes", "en", "de")
        assert response.status_code == 503
        assert response.headers["retry-after"] == "2"
        assert response.json()["code"] == "model_loading"
        wait_for(lambda: states(lazy)["tiny-en-de"] == "loaded", "loaded in the background")
        assert translate(lazy, "Save changes", "en", "de").status_code == 200


# --- fair turns between models ---------------------------------------------------------------


class LoggedEngine:
    """A fake engine (output = the source reversed, one token per step) that writes its name
    into a shared log at every step. The flood's steps last until another model waits for a
    turn (or the quiet work is done), like a real step that outlasts the other thread's
    bookkeeping, so the test sees the scheduler's order and not the OS's."""

    def __init__(self, name: str, log: list[str], turns: RoundRobinTurns, quiet_done=None):
        self.name, self.log, self.turns, self.quiet_done = name, log, turns, quiet_done
        self.steps = 0
        self.decoder_seconds = 0.0
        self._active: dict[Hashable, tuple[list[int], list[int]]] = {}

    @property
    def active_rows(self) -> int:
        return len(self._active)

    def add(self, requests: list[DecodeRequest]) -> list:
        for request in requests:
            self._active[request.request_id] = (list(reversed(request.src_ids)), [])
        return []  # none refused

    @property
    def groups(self) -> int:
        return 1 if self._active else 0

    def encode(self, requests: list[DecodeRequest]) -> SimpleNamespace:
        return SimpleNamespace(requests=list(requests), rejected=[])

    def place(self, encoded: SimpleNamespace) -> None:
        self.add(encoded.requests)

    def estimate(self, newcomers=(), max_rows: int = 64, tolerance: float = 0.0) -> BatchEstimate:
        rows = self.active_rows + sum(new_rows for new_rows, _ in newcomers)
        return BatchEstimate(rows, 0)  # no token budget, no cost model

    def plan(self, max_rows: int = 64, tolerance: float = 0.0) -> SimpleNamespace:
        taken: list[tuple[int, int]] = []
        return SimpleNamespace(
            estimate=lambda newcomers: self.estimate([*taken, *newcomers]),
            take=taken.extend,
        )

    def step(self) -> list[FinishedRequest]:
        if self.quiet_done is not None:
            for _ in range(2000):
                if self.turns.waiting or self.quiet_done.is_set():
                    break
                time.sleep(0.0005)
        self.steps += 1
        self.log.append(self.name)
        finished = []
        for request_id, (target, produced) in list(self._active.items()):
            produced.append(target[len(produced)])
            if len(produced) == len(target):
                finished.append(FinishedRequest(request_id, produced, len(produced)))
                del self._active[request_id]
        return finished

    def drop(self, request_ids) -> None:
        for request_id in request_ids:
            self._active.pop(request_id, None)


@pytest.mark.anyio
async def test_a_flood_on_one_model_does_not_starve_another_by_step_counts():
    turns, log, quiet_done = RoundRobinTurns(), [], threading.Event()
    flood_engine = LoggedEngine("flood", log, turns, quiet_done)
    quiet_engine = LoggedEngine("quiet", log, turns)
    batchers = [
        ContinuousBatcher(
            engine,
            BatchingSettings(batching="continuous", admission_cost_aware=False),
            turn=partial(turns.turn, engine.name),
        )
        for engine in (flood_engine, quiet_engine)
    ]
    for batcher in batchers:
        batcher.start()
    flood, quiet = batchers
    try:
        # 32 sentences of 400 tokens: 400 steps of the flood model.
        rows = [DecodeRequest(src_ids=tuple(range(1, 401)), max_new_tokens=400)] * 32
        flooding = asyncio.ensure_future(flood.submit(rows))
        while flood_engine.steps < 3:
            await asyncio.sleep(0.001)
        [result] = await quiet.submit([DecodeRequest(src_ids=(5, 4, 3, 2, 1, 0), max_new_tokens=8)])
        quiet_done.set()
        assert result.tokens == [0, 1, 2, 3, 4, 5]
        first, last = log.index("quiet"), len(log) - 1 - log[::-1].index("quiet")
        window = log[first : last + 1]
        assert window.count("quiet") == 6
        # Round-robin: never two flood steps in a row while the quiet model had work.
        assert all(window[i : i + 2] != ["flood", "flood"] for i in range(len(window) - 1))
        assert window.count("flood") >= 1  # the flood did run meanwhile
        assert flood_engine.steps < 400  # and was still running
        assert turns.turns["quiet"] >= 6
        flooding.cancel()
    finally:
        for batcher in batchers:
            batcher.close()


def test_models_of_one_process_take_turns(client):
    registry = client.app.state.service.registry
    assert registry.turns is not None
    translate(client, "Save changes", "en", "fr")
    assert registry.turns.turns["tiny-en-fr"] >= 1


# --- the real LibreTranslate client ----------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def server_url(model_dirs):
    import uvicorn

    port = free_port()
    config = uvicorn.Config(
        create_app(settings_for(model_dirs)), host="127.0.0.1", port=port, log_level="warning"
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}/"
    for _ in range(600):
        try:
            if httpx.get(url + "ready").status_code == 200:
                break
        except httpx.TransportError:
            pass
        time.sleep(0.05)
    yield url
    server.should_exit = True
    thread.join(30)


def test_libretranslatepy_client_languages_detect_and_auto_translate(server_url):
    from libretranslatepy import LibreTranslateAPI

    api = LibreTranslateAPI(server_url)
    languages = {entry["code"]: entry["targets"] for entry in api.languages()}
    assert languages == {"de": ["en", "fr"], "en": ["de", "fr"], "fr": []}
    assert api.detect(GERMAN)[0]["language"] == "de"
    text = "Save changes. Open the file."
    translated = api.translate(text, source="auto", target="de")
    direct = httpx.post(
        server_url + "v1/translate", json={"text": text, "source_lang": "en", "target_lang": "de"}
    ).json()
    assert direct["models"] == ["tiny-en-de"]
    assert translated == direct["translations"][0]["text"]
