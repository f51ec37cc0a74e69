"""Glossaries: matching and validation (no model), enforcement through the real pipeline and
API on the tiny model (greedy, beam, html), stored glossaries across a restart, and the
official ``deepl`` client against a live server.

Target terms are strings the tiny model cannot produce on its own (``Q7zeta0``): where one
appears in a translation, the glossary put it there, so counting them is exact.
"""

from __future__ import annotations

import random

import pytest
from fastapi.testclient import TestClient

from service.config import Settings
from service.errors import InputTooLarge
from service.text.glossary import Glossary, GlossaryError, entries_tsv, parse_entries
from service.wiring import create_app
from tests.service_fixtures import _WORDS, tiny_model


def glossary(entries: dict[str, str], max_entries: int = 100) -> Glossary:
    return Glossary.from_entries(entries.items(), max_entries)


def matched(text: str, entries: dict[str, str], keep_out=()) -> list[tuple[str, str]]:
    return [(text[s:e], target) for (s, e), target in glossary(entries).matches(text, keep_out)]


# --- matching ----------------------------------------------------------------------------------


def test_matches_case_insensitively_at_word_boundaries():
    entries = {"file": "Datei"}
    assert matched("File, file and FILE.", entries) == [("File", "Datei")] * 1 + [
        ("file", "Datei"),
        ("FILE", "Datei"),
    ]
    assert matched("profile files file_name", entries) == []


def test_longest_match_wins_where_matches_overlap():
    entries = {"file": "Datei", "file manager": "Dateimanager", "manager": "Verwalter"}
    assert matched("Open the file  manager", entries) == [("file  manager", "Dateimanager")]
    assert matched("the file, the manager", entries) == [
        ("file", "Datei"),
        ("manager", "Verwalter"),
    ]


def test_terms_inside_markup_are_not_matched():
    text = '<a href="file">file</a> {file}'
    found = glossary({"file": "Datei"}).matches(text, [(0, 15), (19, 23), (24, 30)])
    assert [text[s:e] for (s, e), _ in found] == ["file"]
    assert found[0][0] == (15, 19)


# --- validation --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("entries", "code"),
    [
        ({}, "empty_glossary"),
        ({" ": "x"}, "empty_glossary_term"),
        ({"save": ""}, "empty_glossary_term"),
        ({"Save": "a", "save": "b"}, "duplicate_glossary_term"),
        ({"%s files": "x"}, "glossary_term_has_placeholder"),
        ({"<b>": "x"}, "glossary_term_has_placeholder"),
        ({"a\tb": "x"}, "invalid_glossary_term"),
        ({"save": "\uff5f0\uff60"}, "invalid_glossary_term"),
    ],
)
def test_bad_glossaries_are_refused_with_a_code(entries, code):
    with pytest.raises(GlossaryError) as refused:
        glossary(entries)
    assert refused.value.code == code and refused.value.status == 400


def test_more_entries_than_the_limit_is_413():
    with pytest.raises(InputTooLarge) as refused:
        glossary({f"term{i}": "x" for i in range(4)}, max_entries=3)
    assert "MT_MAX_GLOSSARY_ENTRIES=3" in refused.value.message


def test_tsv_and_csv_entries_parse_and_round_trip():
    assert parse_entries("save\tspeichern\n\nopen file\tDatei öffnen\n", "tsv") == [
        ("save", "speichern"),
        ("open file", "Datei öffnen"),
    ]
    assert parse_entries('save,speichern\n"a, b",c\n', "csv") == [
        ("save", "speichern"),
        ("a, b", "c"),
    ]
    entries = [("save", "speichern"), ("open", "öffnen")]
    assert parse_entries(entries_tsv(entries), "tsv") == entries
    with pytest.raises(GlossaryError):
        parse_entries("only one field\n", "tsv")


# --- enforcement through the service -------------------------------------------------------------


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return tiny_model(tmp_path_factory)


def make_settings(model_dir, data_dir, **overrides) -> Settings:
    return Settings(
        exports=[model_dir],
        provider="cpu",
        intra_op_threads=1,
        max_new_tokens=48,
        max_beam_size=4,
        data_dir=data_dir,
        max_glossary_entries=5,
        **overrides,
    )


def ready(client: TestClient) -> TestClient:
    import time

    for _ in range(3000):
        if client.get("/ready").status_code == 200:
            return client
        time.sleep(0.01)
    raise AssertionError("never ready")


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("glossary_data")


@pytest.fixture(scope="module")
def client(model_dir, data_dir):
    with TestClient(create_app(make_settings(model_dir, data_dir))) as test_client:
        yield ready(test_client)


def random_case(word: str, rng: random.Random) -> str:
    return rng.choice([word, word.capitalize(), word.upper()])


@pytest.mark.parametrize("beam_size", [1, 3])
@pytest.mark.parametrize("html", [False, True])
def test_every_target_term_comes_back_exactly_as_often_as_its_source_matched(
    client, beam_size, html
):
    rng = random.Random(beam_size * 10 + html)
    for trial in range(6):
        terms = rng.sample(_WORDS[:40], rng.randint(3, 5))
        entries = {term: f"Q7zeta{i}" for i, term in enumerate(terms)}
        texts, expected = [], []
        for _ in range(4):
            words = [random_case(rng.choice(_WORDS[:40]), rng) for _ in range(rng.randint(3, 9))]
            words.insert(rng.randrange(len(words) + 1), random_case(rng.choice(terms), rng))
            sentence = " ".join(words) + "."
            texts.append(f"<p>{sentence}</p>" if html else sentence)
            lowered = [w.lower() for w in words]
            expected.append({entries[t]: lowered.count(t) for t in terms})
        if html:
            response = client.post(
                "/v2/translate",
                json={
                    "text": texts,
                    "source_lang": "EN",
                    "target_lang": "DE",
                    "tag_handling": "html",
                    "glossary_id": store(client, entries),
                },
            )
            outputs = [t["text"] for t in response.json()["translations"]]
        else:
            response = client.post(
                "/v1/translate",
                json={"text": texts, "glossary": entries, "beam_size": beam_size},
            )
            outputs = [t["text"] for t in response.json()["translations"]]
        assert response.status_code == 200, response.text
        assert sum(sum(c.values()) for c in expected) > 0  # the trial tests something
        for output, counts in zip(outputs, expected, strict=True):
            got = {target: output.count(target) for target in counts}
            assert got == counts, (trial, output, counts)


def store(client: TestClient, entries: dict[str, str]) -> str:
    response = client.post(
        "/v1/glossaries",
        json={"name": "t", "source_lang": "en", "target_lang": "de", "entries": entries},
    )
    assert response.status_code == 201, response.text
    return response.json()["glossary_id"]


def test_a_sentence_that_is_one_term_is_the_target_term(client):
    response = client.post("/v1/translate", json={"text": "Save", "glossary": {"save": "Sichern"}})
    assert response.json()["translations"][0]["text"] == "Sichern"


def test_without_a_glossary_the_target_terms_do_not_appear(client):
    response = client.post("/v1/translate", json={"text": "save the file to the folder."})
    assert "Q7zeta" not in response.json()["translations"][0]["text"]


@pytest.mark.parametrize(
    ("glossary_json", "status", "code"),
    [
        ({"": "x"}, 400, "empty_glossary_term"),
        ({"Save": "a", "SAVE": "b"}, 400, "duplicate_glossary_term"),
        ({"{0} files": "x"}, 400, "glossary_term_has_placeholder"),
        ({f"t{i}": "x" for i in range(6)}, 413, "too_many_glossary_entries"),
        ({"save": 3}, 422, "invalid_request"),
    ],
)
def test_bad_inline_glossaries_are_clear_4xx(client, glossary_json, status, code):
    response = client.post("/v1/translate", json={"text": "save", "glossary": glossary_json})
    assert (response.status_code, response.json()["code"]) == (status, code), response.text


# --- stored glossaries -------------------------------------------------------------------------


def test_stored_glossaries_crud_upload_and_pair_check(client):
    tsv = "save\tQ7zetaS\nfile\tQ7zetaF\n"
    created = client.post(
        "/v1/glossaries",
        data={"name": "ui", "source_lang": "EN", "target_lang": "de"},
        files={"file": ("terms.tsv", tsv.encode())},
    )
    assert created.status_code == 201, created.text
    card = created.json()
    assert (card["source_lang"], card["target_lang"], card["entry_count"]) == ("en", "de", 2)
    gid = card["glossary_id"]
    assert client.get(f"/v1/glossaries/{gid}").json()["entries"] == {
        "save": "Q7zetaS",
        "file": "Q7zetaF",
    }
    assert gid in [g["glossary_id"] for g in client.get("/v1/glossaries").json()["glossaries"]]
    out = client.post("/v1/translate", json={"text": "Save the file.", "glossary_id": gid})
    assert out.status_code == 200
    text = out.json()["translations"][0]["text"]
    assert text.count("Q7zetaS") == 1 and text.count("Q7zetaF") == 1

    csv_upload = client.post(
        "/v1/glossaries",
        data={"name": "c", "source_lang": "en", "target_lang": "de"},
        files={"file": ("terms.csv", b"open,Q7zetaO\n")},
    )
    assert csv_upload.status_code == 201 and csv_upload.json()["entry_count"] == 1

    wrong_pair = client.post(
        "/v1/translate",
        json={"text": "Save.", "glossary_id": gid, "source_lang": "en", "target_lang": "en"},
    )
    assert (wrong_pair.status_code, wrong_pair.json()["code"]) == (
        400,
        "glossary_language_mismatch",
    )
    both = client.post(
        "/v1/translate", json={"text": "Save.", "glossary_id": gid, "glossary": {"a": "b"}}
    )
    assert both.status_code == 400

    assert client.delete(f"/v1/glossaries/{gid}").status_code == 204
    assert client.get(f"/v1/glossaries/{gid}").status_code == 404
    gone = client.post("/v1/translate", json={"text": "Save.", "glossary_id": gid})
    assert (gone.status_code, gone.json()["code"]) == (404, "glossary_not_found")


def test_a_bad_glossary_is_refused_and_the_stored_ones_are_kept(client):
    kept = store(client, {"save": "Q7zetaK"})
    before = client.get("/v1/glossaries").json()["glossaries"]
    bad_entries = (
        ({"": "x"}, 400, "empty_glossary_term"),
        ({"save": " "}, 400, "empty_glossary_term"),
        ({"a": "x", "A": "y"}, 400, "duplicate_glossary_term"),
        ({"{0} files": "x"}, 400, "glossary_term_has_placeholder"),
        ({"<b>save</b>": "x"}, 400, "glossary_term_has_placeholder"),
        ({f"t{i}": "x" for i in range(6)}, 413, "too_many_glossary_entries"),
        ({}, 400, "empty_glossary"),
    )
    for entries, status, code in bad_entries:
        response = client.post(
            "/v1/glossaries",
            json={"name": "bad", "source_lang": "en", "target_lang": "de", "entries": entries},
        )
        assert (response.status_code, response.json()["code"]) == (status, code), response.text
        # The same entries as an upload and through DeepL's API: the same refusal.
        tsv = "".join(f"{source}\t{target}\n" for source, target in entries.items())
        if tsv:
            upload = client.post(
                "/v1/glossaries",
                data={"name": "bad", "source_lang": "en", "target_lang": "de"},
                files={"file": ("bad.tsv", tsv.encode())},
            )
            assert upload.status_code == status, upload.text
            v2 = client.post(
                "/v2/glossaries",
                data={"name": "bad", "source_lang": "EN", "target_lang": "DE", "entries": tsv},
            )
            assert v2.status_code == status and v2.json()["message"], v2.text
    unserved = client.post(
        "/v1/glossaries",
        json={"name": "x", "source_lang": "en", "target_lang": "ja", "entries": {"a": "b"}},
    )
    assert unserved.status_code == 400
    assert client.get("/v1/glossaries").json()["glossaries"] == before
    assert client.get(f"/v1/glossaries/{kept}").json()["entries"] == {"save": "Q7zetaK"}
    out = client.post("/v1/translate", json={"text": "Save.", "glossary_id": kept}).json()
    assert out["translations"][0]["text"].count("Q7zetaK") == 1


def test_stored_glossaries_survive_a_restart(model_dir, tmp_path):
    settings = make_settings(model_dir, tmp_path / "data")
    with TestClient(create_app(settings)) as first:
        gid = store(ready(first), {"save": "Q7zetaR"})
    with TestClient(create_app(settings)) as second:
        ready(second)
        assert second.get(f"/v1/glossaries/{gid}").json()["entries"] == {"save": "Q7zetaR"}
        out = second.post("/v1/translate", json={"text": "Save the file.", "glossary_id": gid})
        assert out.json()["translations"][0]["text"].count("Q7zetaR") == 1


# --- the official DeepL client -----------------------------------------------------------------


def test_the_official_deepl_client_works_unchanged(model_dir, tmp_path):
    deepl = pytest.importorskip("deepl")
    from tests.live_server import live_server

    settings = make_settings(model_dir, tmp_path / "data", api_keys="k1")
    with live_server(settings) as base:
        translator = deepl.Translator("k1", server_url=base.rstrip("/"))
        one = translator.translate_text("Save the file.", target_lang="DE")
        assert one.detected_source_lang == "EN" and one.text
        many = translator.translate_text(
            ["<p>Open <b>the</b> file.</p>", "Close"],
            source_lang="EN",
            target_lang="DE",
            tag_handling="html",
        )
        assert len(many) == 2 and many[0].text.startswith("<p>") and "<b>" in many[0].text

        created = translator.create_glossary(
            "ui", source_lang="EN", target_lang="DE", entries={"save": "Q7zetaD", "file": "Q7zetaE"}
        )
        assert created.entry_count == 2 and created.ready
        listed = translator.list_glossaries()
        assert created.glossary_id in [g.glossary_id for g in listed]
        assert translator.get_glossary_entries(created) == {"save": "Q7zetaD", "file": "Q7zetaE"}
        enforced = translator.translate_text(
            "Save the file.",
            source_lang="EN",
            target_lang="DE",
            glossary=created,
        )
        assert enforced.text.count("Q7zetaD") == 1 and enforced.text.count("Q7zetaE") == 1
        translator.delete_glossary(created)
        with pytest.raises(deepl.GlossaryNotFoundException):
            translator.get_glossary(created.glossary_id)

        usage = translator.get_usage()
        assert usage.character.count > 0 and not usage.any_limit_reached
        assert [lang.code for lang in translator.get_source_languages()] == ["EN"]
        assert [lang.code for lang in translator.get_target_languages()] == ["DE"]
        # DeepL answers glossary pairs in lower case; its client passes them on as sent.
        pairs = translator.get_glossary_languages()
        assert [(p.source_lang, p.target_lang) for p in pairs] == [("en", "de")]

        with pytest.raises(deepl.AuthorizationException):
            deepl.Translator("wrong", server_url=base.rstrip("/")).translate_text(
                "Save", target_lang="DE"
            )
