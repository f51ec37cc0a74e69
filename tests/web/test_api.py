"""The HTTP API against the real app, the real engine and a tiny exported ONNX model.

Every expected translation is computed by a second engine translating the same sentence
alone (``Engine.translate_ids``), so the tests pin that the service adds nothing and loses
nothing on the way: segmenting, placeholders, batching, detokenizing.
"""

from __future__ import annotations

import time

import pytest
from fastapi.testclient import TestClient

from service.config import Settings
from service.text.segmenter import sentence_spans
from service.wiring import create_app
from tests.service_fixtures import only_model, solo_translator, tiny_model

LIMITS = dict(
    max_texts_per_request=8,
    max_chars_per_text=500,
    max_input_tokens=64,
    max_new_tokens=64,
    max_beam_size=4,
    max_body_bytes=4096,
)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """The tiny exported model (built once per session)."""
    return tiny_model(tmp_path_factory)


def make_settings(model_dir, **overrides) -> Settings:
    return Settings(
        exports=[model_dir], provider="cpu", intra_op_threads=1, **{**LIMITS, **overrides}
    )


def wait_ready(client: TestClient) -> None:
    for _ in range(3000):
        if client.get("/ready").status_code == 200:
            return
        time.sleep(0.01)
    raise AssertionError(f"never ready: {client.get('/ready').json()}")


@pytest.fixture(scope="module")
def client(model_dir):
    with TestClient(create_app(make_settings(model_dir))) as test_client:
        wait_ready(test_client)
        yield test_client


@pytest.fixture(scope="module")
def solo(model_dir):
    return solo_translator(model_dir)


def post(client: TestClient, path: str, **kwargs):
    response = client.post(path, **kwargs)
    assert response.status_code < 500, response.text  # never a 500 for client input
    return response


# --- translations ----------------------------------------------------------------------------


def test_single_text_is_what_the_engine_gives_alone(client, solo):
    response = post(client, "/v1/translate", json={"text": "Save changes", "max_new_tokens": 20})
    assert response.status_code == 200
    body = response.json()
    assert body["translations"][0]["text"] == solo("Save changes", 20)
    assert body["translations"][0]["sentences"] == 1
    assert body["model"] == "tiny-random"
    assert (body["source_lang"], body["target_lang"]) == ("en", "de")
    assert body["usage"]["sentences"] == 1 and body["usage"]["input_tokens"] > 0
    assert body["usage"]["output_tokens"] == body["translations"][0]["tokens"]


def test_a_list_keeps_its_order(client, solo):
    texts = ["Open the file", "Delete all files in this folder", "Login", "Print"]
    response = post(client, "/v1/translate", json={"text": texts, "max_new_tokens": 16})
    assert response.status_code == 200
    assert [t["text"] for t in response.json()["translations"]] == [solo(t, 16) for t in texts]


def test_sentences_are_translated_one_by_one_and_joined_with_their_whitespace(client, solo):
    text = "  Save changes.  Open the file?\nPrint this folder "
    response = post(client, "/v1/translate", json={"text": text, "max_new_tokens": 12})
    [translation] = response.json()["translations"]
    parts = [solo(s, 12) for s in ("Save changes.", "Open the file?", "Print this folder")]
    assert translation["text"] == f"  {parts[0]}  {parts[1]}\n{parts[2]} "
    assert translation["sentences"] == 3


def test_placeholders_are_masked_for_the_model_and_restored(client, solo):
    text = "Delete %(count)s files from {folder}"
    response = post(client, "/v1/translate", json={"text": text, "max_new_tokens": 20})
    assert response.json()["translations"][0]["text"] == solo(text, 20)


def test_tags_around_a_sentence_stay_out_of_the_model(client, solo):
    text = "<p><b>Delete %s files</b></p> <br/>"
    response = post(client, "/v1/translate", json={"text": text, "max_new_tokens": 20})
    translation = response.json()["translations"][0]["text"]
    assert translation == "<p><b>" + solo("Delete %s files", 20) + "</b></p> <br/>"


def test_beam_search_is_what_the_engine_gives_alone(client, solo):
    response = post(
        client,
        "/v1/translate",
        json={"text": "Open the file", "beam_size": 3, "max_new_tokens": 10},
    )
    assert response.status_code == 200
    assert response.json()["translations"][0]["text"] == solo("Open the file", 10, beam_size=3)


def test_empty_and_untranslatable_texts_come_back_without_reaching_the_model(client):
    def sentences_decoded() -> float:
        metrics = client.app.state.service.metrics
        return metrics.registry.get_sample_value("mt_sentences_total")

    before = sentences_decoded()
    texts = ["", "   ", "%s", "<br/>", " — "]
    response = post(client, "/v1/translate", json={"text": texts})
    assert response.status_code == 200
    assert [t["text"] for t in response.json()["translations"]] == texts
    assert response.json()["usage"]["sentences"] == 0
    assert sentences_decoded() == before


def test_default_output_length_is_proportional_to_the_source(client):
    settings = client.app.state.service.settings
    response = post(client, "/v1/translate", json={"text": "Save"})
    [translation] = response.json()["translations"]
    source_tokens = response.json()["usage"]["input_tokens"]
    assert (
        translation["tokens"]
        <= settings.limits.output_length_ratio * source_tokens + settings.limits.output_length_slack
    )


# --- LibreTranslate --------------------------------------------------------------------------


def test_libretranslate_json(client, solo):
    default_tokens = only_model(client.app).translator.pipeline.max_new_tokens
    sentence = "Save changes"
    src_len = len(only_model(client.app).translator.tokenizer.encode_one(sentence))
    response = post(
        client, "/translate", json={"q": sentence, "source": "en", "target": "de", "format": "text"}
    )
    assert response.status_code == 200
    options = only_model(client.app).translator.limits.options(None, None)
    assert response.json() == {"translatedText": solo(sentence, default_tokens(src_len, options))}


def test_libretranslate_list_and_auto_source(client):
    texts = ["Open", "Close the window"]
    response = post(client, "/translate", json={"q": texts, "source": "auto", "target": "de"})
    body = response.json()
    expected = post(client, "/v1/translate", json={"text": texts}).json()["translations"]
    assert body["translatedText"] == [t["text"] for t in expected]
    assert body["detectedLanguage"] == [{"language": "en", "confidence": 100.0}] * 2


def test_a_text_in_a_language_no_model_serves_is_refused_naming_it(client):
    french = "Bonjour tout le monde, comment allez-vous?"
    for path, body in (
        ("/translate", {"q": french, "source": "auto", "target": "de"}),
        ("/v1/translate", {"text": french}),
    ):
        response = post(client, path, json=body)
        assert response.status_code == 400, path
        assert "fr is not supported" in response.json()["error"], path
    detected = post(client, "/detect", json={"q": french}).json()
    assert detected[0]["language"] == "fr"


def test_libretranslate_form_body_with_api_key(client):
    form = {"q": "Save changes", "source": "en", "target": "de", "api_key": "ignored"}
    response = post(client, "/translate", data=form)
    assert response.status_code == 200
    expected = post(client, "/v1/translate", json={"text": "Save changes"}).json()
    assert response.json() == {"translatedText": expected["translations"][0]["text"]}


def test_libretranslate_html_keeps_tags(client):
    html = '<p>Save <a href="/x">changes</a></p>'
    response = post(
        client, "/translate", json={"q": html, "source": "en", "target": "de", "format": "html"}
    )
    text = response.json()["translatedText"]
    assert text.startswith("<p>") and text.endswith("</p>")


# --- other endpoints -------------------------------------------------------------------------


def test_languages_in_libretranslate_shape(client):
    assert client.get("/languages").json() == [
        {"code": "de", "name": "German", "targets": []},
        {"code": "en", "name": "English", "targets": ["de"]},
    ]


def test_models_health_ready_docs(client):
    [card] = client.get("/v1/models").json()["data"]
    weights = card.pop("weights_bytes")
    memory = card.pop("memory_bytes")
    assert card == {
        "id": "tiny-random", "source_lang": "en", "target_lang": "de", "languages": [],
        "provider": "cpu", "state": "loaded", "ready": True, "revision": None,
    }  # fmt: skip
    assert weights > 0 and (memory is None or memory >= 0)
    assert client.get("/health").json() == {"status": "ok"}
    assert client.get("/ready").json() == {"status": "ready"}
    assert client.get("/docs").status_code == 200
    paths = client.get("/openapi.json").json()["paths"]
    assert {"/v1/translate", "/translate", "/languages", "/v1/models"} <= set(paths)


def test_metrics_are_prometheus_text_with_batch_and_request_series(client):
    post(client, "/v1/translate", json={"text": "Save"})
    text = client.get("/metrics").text
    for name in (
        "mt_batch_rows_bucket",
        "mt_decode_steps_total",
        "mt_generated_tokens_total",
        "mt_queue_wait_seconds_bucket",
        "mt_queue_depth",
        "mt_inflight_rows",
        'mt_requests_total{route="/v1/translate",status="200"}',
        'mt_request_duration_seconds_bucket{le="0.005",route="/v1/translate",status="200"}',
    ):
        assert name in text, name


# --- errors ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "status", "code", "says"),
    [
        ({"text": 5}, 422, "invalid_request", "text"),
        ({"text": ["ok", 3]}, 422, "invalid_request", "text"),
        ({"text": None}, 422, "invalid_request", "text"),
        ({}, 422, "invalid_request", "text: Field required"),
        ({"text": "a", "colour": "red"}, 422, "invalid_request", "colour"),
        ({"text": []}, 422, "no_texts", "at least one"),
        ({"text": "a" * 501}, 413, "text_too_long", "MT_MAX_CHARS_PER_TEXT=500"),
        ({"text": ["a"] * 9}, 413, "too_many_texts", "MT_MAX_TEXTS_PER_REQUEST=8"),
        ({"text": "save " * 90}, 413, "sentence_too_long", "MT_MAX_INPUT_TOKENS=64"),
        ({"text": "a", "beam_size": 5}, 422, "beam_size_too_large", "MT_MAX_BEAM_SIZE=4"),
        ({"text": "a", "beam_size": 0}, 422, "invalid_request", "beam_size"),
        (
            {"text": "a", "max_new_tokens": 65},
            422,
            "max_new_tokens_too_large",
            "MT_MAX_NEW_TOKENS=64",
        ),
        ({"text": "a", "target_lang": "fr"}, 400, "unsupported_language", "fr is not supported"),
        ({"text": "a", "source_lang": "xx"}, 400, "unsupported_language", "xx is not supported"),
        (
            {"text": "a", "source_lang": "de", "target_lang": "en"},
            400,
            "unsupported_pair",
            "English (en) is not available as a target language from German (de)",
        ),
    ],
)
def test_v1_errors(client, body, status, code, says):
    response = post(client, "/v1/translate", json=body)
    assert response.status_code == status, response.text
    assert response.json()["code"] == code
    assert says in response.json()["error"]


def test_malformed_json_is_400(client):
    response = post(
        client, "/v1/translate", content=b'{"text": ', headers={"content-type": "application/json"}
    )
    assert response.status_code == 400
    assert response.json()["code"] == "malformed_json"
    assert "malformed JSON" in response.json()["error"]


def test_body_over_the_limit_is_413_by_content_length(client):
    response = post(client, "/v1/translate", json={"text": "a" * 5000})
    assert response.status_code == 413
    assert "MT_MAX_BODY_BYTES=4096" in response.json()["error"]


def test_sentence_longer_than_the_model_positions_is_413_not_an_engine_error(model_dir):
    # The tiny model has 128 positions; MT_MAX_INPUT_TOKENS allows more.
    settings = make_settings(model_dir, max_input_tokens=1000, max_chars_per_text=5000)
    with TestClient(create_app(settings)) as roomy:
        wait_ready(roomy)
        response = roomy.post("/v1/translate", json={"text": "save " * 300})
    assert response.status_code == 413
    assert "the model's positions (MT_MAX_INPUT_TOKENS=1000)" in response.json()["error"]


def test_chunked_body_over_the_limit_is_413(client):
    def chunks():
        yield b'{"text": "'
        for _ in range(10):
            yield b"a" * 1000
        yield b'"}'

    response = post(
        client, "/v1/translate", content=chunks(), headers={"content-type": "application/json"}
    )
    assert response.status_code == 413
    assert "MT_MAX_BODY_BYTES=4096" in response.json()["error"]


@pytest.mark.parametrize(
    ("kwargs", "status", "says"),
    [
        ({"json": {"source": "en", "target": "de"}}, 400, "q"),
        ({"json": {"q": "a", "source": "en", "target": "fr"}}, 400, "fr is not supported"),
        ({"json": {"q": "a", "source": "es", "target": "de"}}, 400, "es is not supported"),
        ({"json": {"q": "a", "format": "pdf"}}, 400, "format"),
        ({"json": {"q": 7}}, 400, "q"),
        ({"json": ["q"]}, 400, "JSON object"),
        (
            {"content": b"{q", "headers": {"content-type": "application/json"}},
            400,
            "malformed JSON",
        ),
        ({"data": {"source": "en"}}, 400, "Invalid request: missing q parameter"),
        # LibreTranslate tests `if not q`: an empty text or list is missing too.
        ({"json": {"q": "", "source": "en"}}, 400, "Invalid request: missing q parameter"),
        ({"json": {"q": [], "source": "en"}}, 400, "Invalid request: missing q parameter"),
        ({"data": {"q": "", "source": "en"}}, 400, "Invalid request: missing q parameter"),
        ({"json": {"q": "a" * 501}}, 413, "MT_MAX_CHARS_PER_TEXT"),
    ],
)
def test_libretranslate_errors_use_its_error_shape(client, kwargs, status, says):
    response = post(client, "/translate", **kwargs)
    assert response.status_code == status, response.text
    assert says in response.json()["error"]


@pytest.mark.parametrize(
    ("q", "says"),
    [("a" * 501, "MT_MAX_CHARS_PER_TEXT=500"), (["a"] * 9, "MT_MAX_TEXTS_PER_REQUEST=8")],
)
def test_detect_has_the_limits_of_translate(client, q, says):
    response = post(client, "/detect", json={"q": q})
    assert response.status_code == 413, response.text
    assert says in response.json()["error"]


def test_unknown_route_and_method_are_json(client):
    assert client.get("/nope").json()["code"] == "http_404"
    response = client.get("/v1/translate")
    assert response.status_code == 405 and "error" in response.json()


def test_a_model_that_fails_to_load_is_never_ready(tmp_path):
    with TestClient(create_app(make_settings(tmp_path / "missing"))) as test_client:
        for _ in range(3000):
            if test_client.get("/health").status_code == 503:
                break
            time.sleep(0.01)
        assert test_client.get("/health").json()["status"] == "failed"
        ready = test_client.get("/ready")
        assert ready.status_code == 503 and ready.headers["retry-after"] == "1"
        response = test_client.post("/v1/translate", json={"text": "Save"})
        assert response.status_code == 503
        assert response.headers["retry-after"] == "1"
        assert "failed" in response.json()["error"]
        # The reason is the exception's type; its text (here a path) stays in the log.
        assert str(tmp_path) not in response.text and str(tmp_path) not in ready.text


# --- translation cache -----------------------------------------------------------------------


def test_cache_answers_repeated_sentences_without_the_model(model_dir):
    with TestClient(create_app(make_settings(model_dir, translation_cache_size=16))) as cached:
        wait_ready(cached)
        body = {"text": "Save changes. Open the file.", "max_new_tokens": 12}
        first = cached.post("/v1/translate", json=body).json()
        second = cached.post("/v1/translate", json=body).json()
        other_options = cached.post("/v1/translate", json={**body, "max_new_tokens": 11}).json()
        registry = cached.app.state.service.metrics.registry
    assert first["usage"]["cached_sentences"] == 0 and first["usage"]["sentences"] == 2
    assert second["usage"]["cached_sentences"] == 2 and second["usage"]["sentences"] == 0
    assert second["translations"] == first["translations"]
    assert other_options["usage"]["cached_sentences"] == 0  # options are part of the key
    assert registry.get_sample_value("mt_cache_hits_total") == 2


# --- sentence splitting ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "language", "sentences"),
    [
        ("Hello world. How are you?  Fine!", "en", ["Hello world.", "How are you?", "Fine!"]),
        ("Dr. Smith left. He was late.", "en", ["Dr. Smith left.", "He was late."]),
        ("See e.g. the manual. Then go.", "en", ["See e.g. the manual.", "Then go."]),
        ("U.S. Army units. Next.", "en", ["U.S. Army units.", "Next."]),
        (
            "Das ist z. B. gut. Am 3. Oktober kommt er.",
            "de",
            ["Das ist z. B. gut.", "Am 3. Oktober kommt er."],
        ),
        ("Vraiment ? Oui. Non !", "fr", ["Vraiment ?", "Oui.", "Non !"]),
        ("¿Qué? ¡Hola! Sí, Sr. López.", "es", ["¿Qué?", "¡Hola!", "Sí, Sr. López."]),
        ("Wait... What?", "en", ["Wait...", "What?"]),
        ('"Stop." He said.', "en", ['"Stop."', "He said."]),
        (
            "version 2.1 is out. see www.x.org/a.b now",
            "en",
            ["version 2.1 is out. see www.x.org/a.b now"],
        ),
        ("One\nTwo\r\n\nThree", "en", ["One", "Two", "Three"]),
        ("   ", "en", []),
    ],
)
def test_sentence_splitting(text, language, sentences):
    assert [text[a:b] for a, b in sentence_spans(text, language)] == sentences


@pytest.mark.parametrize("value, expected", [("false", False), ("true", True)])
def test_mt_access_log_switches_uvicorns_access_log(monkeypatch, value, expected):
    from service.config import Settings
    from service.web.server import uvicorn_config

    monkeypatch.setenv("MT_ACCESS_LOG", value)
    settings = Settings()
    assert settings.process.access_log is expected
    config = uvicorn_config(object(), settings)
    assert config.access_log is expected
    assert (config.host, config.port) == (settings.process.host, settings.process.port)
