"""The one request type (service/translation/request.py) and its language pair, read once at
the web edge (service/translation/languages.py)."""

from __future__ import annotations

import pytest

from service.text.pipeline import DecodingOptions
from service.translation.languages import LanguageCode, LanguagePair
from service.translation.request import Output, Routing, TranslationRequest


@pytest.mark.parametrize(
    ("source", "target", "expected"),
    [
        ("EN", " de ", (("en", False), ("de", False))),
        (" DEU_LATN ", "eng_Latn", (("de", True), ("en", True))),
        (None, "de", (("auto", False), ("de", False))),
        ("", "", (("auto", False), ("", False))),
        ("auto", None, (("auto", False), ("", False))),
    ],
)
def test_a_pair_is_read_once_into_canonical_codes_and_how_they_were_spelt(source, target, expected):
    pair = LanguagePair.parse(source, target)
    assert (
        (pair.source.code, pair.source.nllb_spelt),
        (pair.target.code, pair.target.nllb_spelt),
    ) == expected
    assert pair.detects == (expected[0][0] == "auto")


def test_responses_spell_a_code_as_the_client_did():
    assert LanguageCode.parse("deu_Latn").shown == "deu_Latn"
    assert LanguageCode.parse("DE").shown == "de"
    assert LanguagePair.of("de", "en").source.shown == "de"


def request(**fields) -> TranslationRequest:
    return TranslationRequest(
        texts=["Open"],
        languages=LanguagePair.parse("en", "de"),
        options=DecodingOptions(1, 32, 1.0),
        **fields,
    )


def test_alternatives_are_counted_only_with_the_alternatives_output():
    assert request(output=Output.ALTERNATIVES, alternatives=2).alternatives == 2
    with pytest.raises(ValueError, match="alternatives"):
        request(output=Output.ALTERNATIVES)
    with pytest.raises(ValueError, match="alternatives"):
        request(alternatives=2)


def test_html_comes_back_whole_and_by_one_route():
    assert request(format="html").format == "html"
    with pytest.raises(ValueError, match="HTML"):
        request(format="html", output=Output.STREAM)
    with pytest.raises(ValueError, match="HTML"):
        request(format="html", routing=Routing.EACH_TEXT)
