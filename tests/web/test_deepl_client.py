"""The official ``deepl`` client, unchanged, against the real app on a real socket with three
tiny models (en→de, de→en, en→fr): every listed target language translates, and the text
options DeepL documents do what DeepL says (``ignore_tags``, ``splitting_tags``,
``non_splitting_tags``, ``outline_detection``, ``split_sentences``, ``preserve_formatting``).

The tiny models translate into noise, so each expectation is the service's (or the engine's)
own translation of what DeepL's option says should reach the model: a sentence alone
(``solo``), or the same markup under LibreTranslate's ``format: "html"`` with an HTML tag the service already treats
that way.
"""

from __future__ import annotations

import httpx
import pytest

from service.config import Settings
from service.text.segmenter import keep_formatting
from tests.live_server import live_server
from tests.service_fixtures import language_models, solo_translator

deepl = pytest.importorskip("deepl")
MAX_NEW_TOKENS = 16  # every sentence here has 3+ tokens: its budget is this


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    return language_models(tmp_path_factory)


@pytest.fixture(scope="module")
def base_url(models, tmp_path_factory):
    settings = Settings(
        exports=list(models.values()),
        provider="cpu",
        intra_op_threads=1,
        max_new_tokens=MAX_NEW_TOKENS,
        data_dir=tmp_path_factory.mktemp("deepl_client_data"),
    )
    with live_server(settings) as url:
        yield url


@pytest.fixture(scope="module")
def translator(base_url):
    return deepl.Translator("any", server_url=base_url.rstrip("/"))


@pytest.fixture(scope="module")
def solo(models):
    return solo_translator(models[("en", "de")])


def v1(base_url: str, text: str, source: str, target: str) -> str:
    body = {"text": text, "source_lang": source, "target_lang": target}
    response = httpx.post(f"{base_url}v1/translate", json=body, timeout=60)
    assert response.status_code == 200, response.text
    return response.json()["translations"][0]["text"]


def html(base_url: str, text: str) -> str:
    """en→de of an HTML fragment (LibreTranslate's ``format: "html"``)."""
    body = {"q": text, "source": "en", "target": "de", "format": "html"}
    response = httpx.post(f"{base_url}translate", json=body, timeout=60)
    assert response.status_code == 200, response.text
    return response.json()["translatedText"]


# --- item: target languages as DeepL lists them -------------------------------------------


def test_every_listed_target_translates_and_english_is_listed_by_region(base_url, translator):
    codes = [language.code for language in translator.get_target_languages()]
    assert "EN" not in codes and {"EN-GB", "EN-US"} <= set(codes), codes
    for code in codes:
        source = "DE" if code.startswith("EN") else "EN"
        result = translator.translate_text(
            "Speichern Sie die Datei", source_lang=source, target_lang=code
        )
        assert result.text, code
    # Both regions are the English model's translation.
    english = v1(base_url, "Speichern Sie die Datei", "de", "en")
    for code in ("EN-GB", "EN-US"):
        assert (
            translator.translate_text(
                "Speichern Sie die Datei", source_lang="DE", target_lang=code
            ).text
            == english
        )


# --- ignore_tags, splitting_tags, non_splitting_tags, outline_detection --------------------


def test_ignore_tags_keeps_the_element_untranslated_inside_its_sentence(base_url, translator):
    source = "<p>Open the <keep>Save</keep> menu.</p>"
    result = translator.translate_text(
        source, source_lang="EN", target_lang="DE", tag_handling="xml", ignore_tags="keep"
    ).text
    # The sentence reaches the model whole, with the element as one opaque piece: as the
    # service already does for an inline <code>.
    as_code = html(base_url, "<p>Open the <code>Save</code> menu.</p>")
    assert result == as_code.replace("<code>Save</code>", "<keep>Save</keep>")
    assert result.count("<keep>Save</keep>") == 1


XML = "<doc><par>Open the <x>file</x> now.</par><par>Save it.</par></doc>"


def test_non_splitting_tags_keep_a_sentence_whole(base_url, translator):
    # As a sentence with an inline <b>: the tag crosses the model as a placeholder.
    inline = html(base_url, XML.replace("x>", "b>"))
    expected = inline.replace("<b>", "<x>").replace("</b>", "</x>")
    whole = translator.translate_text(
        XML, source_lang="EN", target_lang="DE", tag_handling="xml", non_splitting_tags=["x"]
    ).text
    assert whole == expected
    # Outline detection off: only the splitting tags split, every other tag is inline.
    manual = translator.translate_text(
        XML,
        source_lang="EN",
        target_lang="DE",
        tag_handling="xml",
        outline_detection=False,
        splitting_tags="par,doc",
    ).text
    assert manual == expected
    # By default an unknown tag splits: "Open the", "file" and "now." are three texts.
    split = translator.translate_text(XML, source_lang="EN", target_lang="DE", tag_handling="xml")
    assert split.text != expected
    # A splitting tag splits even where HTML's rules would keep it inline.
    parts = translator.translate_text(
        "<p>Open the <b>file</b> now.</p>",
        source_lang="EN",
        target_lang="DE",
        tag_handling="xml",
        splitting_tags="b",
    ).text
    alone = [v1(base_url, text, "en", "de") for text in ("Open the", "file", "now.")]
    assert parts == f"<p>{alone[0]} <b>{alone[1]}</b> {alone[2]}</p>"


# --- split_sentences and preserve_formatting -----------------------------------------------


def test_split_sentences_zero_one_and_nonewlines(translator, solo):
    def translate(text: str, split: str) -> str:
        return translator.translate_text(
            text, source_lang="EN", target_lang="DE", split_sentences=split
        ).text

    two = "Save the file. Open the window."
    assert translate(two, "1") == f"{solo('Save the file.', 16)} {solo('Open the window.', 16)}"
    assert translate(two, "0") == solo(two, MAX_NEW_TOKENS)
    assert translate(two, "0") != translate(two, "1")
    lines = "Save the file\nand open the window."
    by_lines = f"{solo('Save the file', 16)}\n{solo('and open the window.', 16)}"
    assert translate(lines, "1") == by_lines
    assert translate(lines, "nonewlines") == solo("Save the file and open the window.", 16)
    assert translate(lines, "nonewlines") != by_lines


def test_preserve_formatting_keeps_first_letter_case_and_final_punctuation(translator, solo):
    changed = 0
    for source in ("open the window.", "Save the file", "save the file?"):
        plain = solo(source, MAX_NEW_TOKENS)
        kept = translator.translate_text(
            source, source_lang="EN", target_lang="DE", preserve_formatting=True
        ).text
        assert kept == keep_formatting(source, plain)
        changed += kept != plain
    assert changed  # the option did something to the model's output


@pytest.mark.parametrize(
    ("source", "model_output", "kept"),
    [
        ("file name", "Dateiname.", "dateiname"),
        ("Save as…", "speichern unter", "Speichern unter…"),
        ("Are you sure?", "Sind Sie sicher ?", "Sind Sie sicher ?"),
        ("save it", "«Speichern»", "«speichern»"),
        ("Done.\n", "Fertig!  ", "Fertig.  "),
    ],
)
def test_keep_formatting_matches_the_source_sentence(source, model_output, kept):
    assert keep_formatting(source, model_output) == kept
