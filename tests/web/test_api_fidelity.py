"""Nothing the client wrote is silently lost, through both APIs, greedy and beam search.

The tiny model spells printable ASCII and the letters of its word list; emoji, other
scripts, symbols and control characters are beyond it, as such characters are beyond a real
model's vocabulary. A property test (hypothesis, seeded and bounded) mixes translatable words
with such characters; every one of them must come back exactly as often as it was sent.
"""

from __future__ import annotations

import string
import time
import unicodedata
from collections import Counter
from html import escape, unescape

import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from service.config import Settings
from service.text.placeholders import SYMBOL_CLOSE, SYMBOL_OPEN
from service.wiring import create_app
from tests.service_fixtures import _WORDS, tiny_model

# Every character the tiny model's tokenizer was trained on (service_fixtures): anything
# else is beyond it and must come back verbatim.
SPELLED = frozenset(string.printable) | frozenset("".join(_WORDS))
INSERTS = (
    "😀", "👍🏽", "👨‍👩‍👧", "🇩🇪", "ℹ️", "✔", "→", "©", "Ω", "№", "…", "—", "€",
    "東京", "Дмитрий", "Zoë", "Ἀθῆναι", "\x00", "\x1b", "\x7f",
)  # fmt: skip
BEAM = 3


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return tiny_model(tmp_path_factory)


def serve(model_dir, **overrides) -> TestClient:
    settings = Settings(
        exports=[model_dir], provider="cpu", intra_op_threads=1, max_new_tokens=64, **overrides
    )
    return TestClient(create_app(settings))


def wait_ready(client: TestClient) -> None:
    for _ in range(3000):
        if client.get("/ready").status_code == 200:
            return
        time.sleep(0.01)
    raise AssertionError(f"never ready: {client.get('/ready').json()}")


@pytest.fixture(scope="module")
def clients(model_dir):
    """``{"greedy": client, "beam": client}``: the default beam size is what LibreTranslate
    requests get, so beam search on /translate needs an app of its own."""
    with serve(model_dir) as greedy, serve(model_dir, default_beam_size=BEAM) as beam:
        wait_ready(greedy)
        wait_ready(beam)
        yield {"greedy": greedy, "beam": beam}


def translate_v1(client: TestClient, text: str, beam_size: int, **languages) -> str:
    response = client.post(
        "/v1/translate", json={"text": text, "beam_size": beam_size, **languages}
    )
    assert response.status_code == 200, response.text
    return response.json()["translations"][0]["text"]


def translate_libre(client: TestClient, text: str, **languages) -> str:
    response = client.post("/translate", json={"q": text, **languages})
    assert response.status_code == 200, response.text
    return response.json()["translatedText"]


def translate_html(client: TestClient, text: str) -> str:
    """``text`` as the content of a paragraph through LibreTranslate's HTML path (the text
    nodes of service/text/html.py), the paragraph's content read back out."""
    html = f"<p>{escape(text, quote=False)}</p>"
    translated = translate_libre(client, html, format="html")
    assert translated.startswith("<p>") and translated.endswith("</p>"), translated
    return unescape(translated.removeprefix("<p>").removesuffix("</p>"))


def all_routes(clients, text: str) -> dict[str, str]:
    """The translation of ``text`` by each API, and the HTML path, with greedy and with beam
    search."""
    return {
        "v1 greedy": translate_v1(clients["greedy"], text, 1),
        "v1 beam": translate_v1(clients["greedy"], text, BEAM),
        "libretranslate greedy": translate_libre(clients["greedy"], text),
        "libretranslate beam": translate_libre(clients["beam"], text),
        "html greedy": translate_html(clients["greedy"], text),
        "html beam": translate_html(clients["beam"], text),
    }


def beyond_the_model(text: str) -> Counter[str]:
    return Counter(char for char in text if char not in SPELLED)


foreign_text = st.text(
    st.characters(
        min_codepoint=0x370,
        max_codepoint=0x1FAFF,
        categories=("L", "M", "N", "P", "S"),
        exclude_characters=SYMBOL_OPEN + SYMBOL_CLOSE,  # the service's own mask brackets
    ),
    min_size=1,
    max_size=3,
)
texts = st.lists(
    st.tuples(
        st.sampled_from(_WORDS[:50]) | st.sampled_from(INSERTS) | foreign_text,
        st.sampled_from([" ", " ", " ", "", ". ", ", "]),
    ),
    min_size=2,
    max_size=8,
).map(lambda parts: "".join(part + joiner for part, joiner in parts).strip())


@settings(
    max_examples=25,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(text=texts)
def test_every_character_beyond_the_model_comes_back_as_often_as_sent(clients, text):
    if not unicodedata.is_normalized("NFC", text):
        text = unicodedata.normalize("NFC", text)
    sent = beyond_the_model(text)
    for route, translation in all_routes(clients, text).items():
        assert beyond_the_model(translation) == sent, (route, text, translation)
        for insert in INSERTS:
            if insert in text and insert not in (" ", ""):
                assert insert in translation, (route, insert, translation)
        assert unicodedata.is_normalized("NFC", translation), (route, text, translation)


@pytest.mark.parametrize(
    "text",
    ["smile 😀 ok", "Send the file to Дмитрий Иванов", "👍🏽", "Toggle the view ℹ️", "東京"],
)
def test_emoji_symbols_and_names_come_back_in_place(clients, text):
    for route, translation in all_routes(clients, text).items():
        for run in ("😀", "Дмитрий Иванов", "👍🏽", "ℹ️", "東京"):
            assert translation.count(run) == text.count(run), (route, translation)


@pytest.mark.parametrize(
    "text, kept",
    [
        ("Do not ask © again ™ for this → session € 😀", ["©", "™", "→", "€", "😀"]),
        ("save the file + open | close ~ the folder", ["+", "|", "~"]),
        ("pay $5.99 for the file", ["$5.99"]),
        ("do not ß open the file", ["ß"]),
    ],
)
def test_symbols_and_lone_letters_the_model_spells_come_back(clients, model_dir, text, kept):
    """The tiny tokenizer spells ``+ | ~ $ ß`` (printable ASCII and its word list): without
    the protection the model is free to drop them, and the random model does. It may also
    write such characters of its own (they are in its vocabulary), hence "at least"."""
    from service.text.tokenizer import Tokenizer

    tokenizer = Tokenizer.from_dir(model_dir)
    assert all(tokenizer.spells(char) for char in "+|~$5ß")
    for route, translation in all_routes(clients, text).items():
        for run in kept:
            assert translation.count(run) >= text.count(run), (route, run, translation)


def test_nul_and_control_characters_are_kept_where_they_were(clients):
    text = "save\x00 the file\x1b[0m"
    for route, translation in all_routes(clients, text).items():
        assert translation.count("\x00") == 1 and translation.count("\x1b") == 1, route


def test_nfc_in_nfc_out_with_combining_marks_kept(clients):
    text = "open the file for Zoë and Jürgen, the q\u0301uery"  # q + combining acute: no NFC form
    for route, translation in all_routes(clients, text).items():
        assert unicodedata.is_normalized("NFC", translation), route
        assert "Zoë" in translation and "q\u0301uery" in translation, (route, translation)


@pytest.mark.parametrize("source, target", [("EN", "DE"), ("En", "de"), (" en ", " De ")])
def test_language_codes_in_any_case_and_with_spaces_are_accepted(clients, source, target):
    client = clients["greedy"]
    expected = translate_v1(client, "save the file", 1)
    assert translate_v1(client, "save the file", 1, source_lang=source, target_lang=target) == (
        expected
    )
    assert translate_libre(client, "save the file", source=source, target=target) == expected


def test_an_unsupported_language_is_still_refused(clients):
    response = clients["greedy"].post(
        "/translate", json={"q": "x", "source": " FR ", "target": "de"}
    )
    assert response.status_code == 400 and "fr" in response.json()["error"]
