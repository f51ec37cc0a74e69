"""Translation memories: the store on its own (matching, growing, refusals that write
nothing, the earlier file name), then through the service on the tiny model: a paragraph
with one approved sentence gets that sentence verbatim and the model's translation of the
others, whatever the API (``/v1``, stream, LibreTranslate, DeepL with html), counted in usage
and metrics, a pivot included, and memories across a restart.

Approved targets are strings the tiny model cannot produce (``Q7mem``), and the model's part
of each answer is compared with the same sentences translated with memories off, so a test
sees exactly which segments the memory wrote.
"""

from __future__ import annotations

import json

import pytest
from fastapi.testclient import TestClient

from service.config import Settings
from service.errors import InputTooLarge, NotFound
from service.storage.memories import (
    NO_MEMORY,
    PAIR_DEFAULT,
    MemoryChoice,
    MemoryEntriesError,
    MemoryStore,
)
from service.storage.sqlite import FILE_NAME, SqliteDatabase
from service.wiring import create_app
from tests.ready import wait_ready
from tests.service_fixtures import language_models, tiny_model

# --- the store ---------------------------------------------------------------------------------


@pytest.fixture
def store(tmp_path) -> MemoryStore:
    return MemoryStore(SqliteDatabase(tmp_path / FILE_NAME), max_chars=100)


def test_exact_match_after_normalising_whitespace_only(store):
    store.add(None, "en", "de", {"Save the file.": "Q7mem speichern."}.items())
    find = store.lookup(PAIR_DEFAULT, "en", "de")
    assert find is not None
    assert find("Save the file.") == "Q7mem speichern."
    assert find("  Save \t the\nfile. ") == "Q7mem speichern."
    assert find("save the file.") is None  # case counts
    assert find("Save the file") is None  # so does punctuation
    assert find("Save the file. Now.") is None
    assert store.lookup(PAIR_DEFAULT, "en", "fr") is None  # no default memory for en->fr
    assert store.lookup(NO_MEMORY, "en", "de") is None


def test_a_memory_grows_and_the_latest_approval_wins(store):
    first = store.add("docs", "en", "de", [("Open.", "Q7a"), ("Close.", "Q7b")])
    assert (first.created, first.added, first.replaced, first.info.entry_count) == (
        True,
        2,
        0,
        2,
    )
    second = store.add("docs", "en", "de", [("Close.", "Q7c"), ("New.", "Q7d")])
    assert (second.created, second.added, second.replaced, second.info.entry_count) == (
        False,
        1,
        1,
        3,
    )
    find = store.lookup(MemoryChoice("docs"), "en", "de")
    assert find is not None and find("Close.") == "Q7c" and find("Open.") == "Q7a"
    assert store.entries("docs") == [("Close.", "Q7c"), ("New.", "Q7d"), ("Open.", "Q7a")]
    assert [m.memory_id for m in store.list()] == ["docs"]
    assert not store.info("docs").is_default
    # The pair's default memory is another one: a named memory is used only when named.
    assert store.lookup(PAIR_DEFAULT, "en", "de") is None


@pytest.mark.parametrize(
    ("memory_id", "pair", "entries", "code"),
    [
        ("docs", ("en", "de"), [("", "x")], "empty_memory_segment"),
        ("docs", ("en", "de"), [("a", " ")], "empty_memory_segment"),
        ("docs", ("en", "de"), [], "empty_memory"),
        ("docs", ("en", "de"), [("a b", "x"), ("a  b", "y")], "conflicting_memory_entries"),
        ("docs", ("en", "fr"), [("a", "x")], "memory_language_mismatch"),
        ("no spaces", ("en", "de"), [("a", "x")], "invalid_memory_id"),
        ("default:en-fr", ("en", "de"), [("a", "x")], "invalid_memory_id"),
    ],
)
def test_a_refused_post_writes_nothing(store, memory_id, pair, entries, code):
    store.add("docs", "en", "de", [("Keep.", "Q7k")])
    before = store.entries("docs"), store.list()
    with pytest.raises(MemoryEntriesError) as refused:
        store.add(memory_id, *pair, entries)
    assert refused.value.code == code and refused.value.status == 400
    assert (store.entries("docs"), store.list()) == before


def test_over_long_segments_are_413_and_unknown_ids_404(store):
    with pytest.raises(InputTooLarge):
        store.add(None, "en", "de", [("x" * 101, "y")])
    assert store.list() == []
    for call in (store.info, store.entries, store.delete):
        with pytest.raises(NotFound):
            call("nope")
    with pytest.raises(NotFound):
        store.lookup(MemoryChoice("nope"), "en", "de")
    store.add("docs", "en", "de", [("a", "b")])
    with pytest.raises(MemoryEntriesError) as refused:
        store.lookup(MemoryChoice("docs"), "de", "en")
    assert refused.value.code == "memory_language_mismatch"
    store.delete("docs")
    assert store.list() == [] and store.lookup(PAIR_DEFAULT, "en", "de") is None


def _counting_reads(store: MemoryStore) -> list[int]:
    """A counter of the store's database reads (a list of one int)."""
    reads = [0]
    read = store.database.read

    def counted():
        reads[0] += 1
        return read()

    store.database.read = counted  # type: ignore[method-assign]
    return reads


def test_an_owner_without_memories_costs_no_query_until_a_memory_is_written(store):
    reads = _counting_reads(store)
    assert store.lookup(MemoryChoice(owner_key="k"), "en", "de") is None
    assert reads == [1]
    for _ in range(3):
        assert store.lookup(MemoryChoice(owner_key="k"), "en", "de") is None
    assert reads == [1]  # kept: no memory was written since
    store.add(None, "en", "de", [("Quit", "Q7q")], owner_key="k")
    find = store.lookup(MemoryChoice(owner_key="k"), "en", "de")
    assert find is not None and find("Quit") == "Q7q"


def test_a_memory_written_or_deleted_through_another_process_holds_for_the_next_request(
    tmp_path,
):
    # Two stores on one file, as two front-ends of the multi-process service open it.
    here = MemoryStore(SqliteDatabase(tmp_path / FILE_NAME), max_chars=100)
    there = MemoryStore(SqliteDatabase(tmp_path / FILE_NAME), max_chars=100)
    assert here.lookup(PAIR_DEFAULT, "en", "de") is None  # kept as "none"
    there.add(None, "en", "de", [("Quit", "Q7q")])
    find = here.lookup(PAIR_DEFAULT, "en", "de")
    assert find is not None and find("Quit") == "Q7q"
    there.delete("default:en-de")
    assert here.lookup(PAIR_DEFAULT, "en", "de") is None


# --- through the service -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return tiny_model(tmp_path_factory)


def make_settings(model_dir, data_dir, **overrides) -> Settings:
    return Settings(
        exports=[model_dir],
        provider="cpu",
        intra_op_threads=1,
        max_new_tokens=24,
        data_dir=data_dir,
        translation_cache_size=0,
        **overrides,
    )


@pytest.fixture(scope="module")
def client(model_dir, tmp_path_factory):
    settings = make_settings(model_dir, tmp_path_factory.mktemp("memory_data"))
    with TestClient(create_app(settings)) as test_client:
        wait_ready(test_client)
        yield test_client


def post(client: TestClient, entries, **fields) -> dict:
    body = {"source_lang": "en", "target_lang": "de", "entries": entries, **fields}
    response = client.post("/v1/memories", json=body)
    assert response.status_code in (200, 201), response.text
    return response.json()


def model_only(client: TestClient, texts: list[str]) -> list[str]:
    """The model's translations, memories off."""
    response = client.post("/v1/translate", json={"text": texts, "use_memory": False})
    assert response.status_code == 200, response.text
    return [t["text"] for t in response.json()["translations"]]


A, B, C = "Open the file.", "Save the changes.", "Close the window."


def memory_hits(client: TestClient) -> float:
    for line in client.get("/metrics").text.splitlines():
        if line.startswith("mt_memory_hits_total "):
            return float(line.split()[1])
    raise AssertionError("no mt_memory_hits_total")


def test_a_paragraph_gets_its_approved_sentence_verbatim_and_the_model_for_the_rest(client):
    card = post(client, {"Save   the changes.": "Q7mem Änderungen speichern."})
    assert (card["memory_id"], card["default"], card["added"]) == ("default:en-de", True, 1)
    a, c = model_only(client, [A, C])
    hits = memory_hits(client)
    response = client.post("/v1/translate", json={"text": f"{A} {B}\n{C}"})
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["translations"][0]["text"] == f"{a} Q7mem Änderungen speichern.\n{c}"
    assert body["usage"]["memory_sentences"] == 1 and body["usage"]["sentences"] == 2
    assert memory_hits(client) == hits + 1
    # A text the memory knows whole, its outer whitespace kept; no row reaches the model.
    whole = client.post("/v1/translate", json={"text": ["  Save the\tchanges. ", B]}).json()
    assert [t["text"] for t in whole["translations"]] == [
        "  Q7mem Änderungen speichern. ",
        "Q7mem Änderungen speichern.",
    ]
    assert whole["usage"]["sentences"] == 0 and whole["usage"]["memory_sentences"] == 2
    # Off: the model's translation, which is not the approved one.
    off = client.post("/v1/translate", json={"text": B, "use_memory": False}).json()
    assert "Q7mem" not in off["translations"][0]["text"]


def test_a_named_memory_is_used_when_named_and_only_then(client):
    post(client, {"Save the changes.": "Q7mem default."})
    card = post(client, {"Save the changes.": "Q7mem named."}, memory_id="proj-1")
    assert (card["memory_id"], card["default"]) == ("proj-1", False)

    def text(**fields) -> str:
        response = client.post("/v1/translate", json={"text": B, **fields})
        assert response.status_code == 200, response.text
        return response.json()["translations"][0]["text"]

    assert text(memory_id="proj-1") == "Q7mem named."
    assert text() == "Q7mem default."
    assert "Q7mem" not in text(use_memory=False)
    unknown = client.post("/v1/translate", json={"text": B, "memory_id": "nope"})
    assert (unknown.status_code, unknown.json()["code"]) == (404, "memory_not_found")
    both = client.post("/v1/translate", json={"text": B, "memory_id": "x", "use_memory": False})
    assert both.status_code == 400


def test_markup_at_a_sentences_edges_goes_around_the_approved_translation(client):
    post(client, {"Close the window.": "Q7mem Fenster schließen."})
    out = client.post("/v1/translate", json={"text": "<b>Close the window.</b>"}).json()
    assert out["translations"][0]["text"] == "<b>Q7mem Fenster schließen.</b>"
    # DeepL's html path: the memory answers a text unit between tags.
    html = client.post(
        "/v2/translate",
        json={
            "text": ["<p>Open the file. <i>Close the window.</i></p>"],
            "target_lang": "DE",
            "source_lang": "EN",
            "tag_handling": "html",
        },
    )
    assert html.status_code == 200, html.text
    assert "<i>Q7mem Fenster schließen.</i></p>" in html.json()["translations"][0]["text"]


def test_every_api_uses_the_pairs_default_memory_and_counts_it(client):
    post(client, {"Open the file.": "Q7mem Datei öffnen."})
    libre = client.post("/translate", json={"q": A, "source": "en", "target": "de"})
    assert libre.json()["translatedText"] == "Q7mem Datei öffnen."
    usage_before = client.get("/v2/usage").json()["translation_memory_segment_count"]
    deepl = client.post(
        "/v2/translate", data={"text": [A, "Delete the folder."], "target_lang": "DE"}
    )
    assert deepl.status_code == 200, deepl.text
    assert deepl.json()["translations"][0]["text"] == "Q7mem Datei öffnen."
    assert client.get("/v2/usage").json()["translation_memory_segment_count"] == usage_before + 1
    post(client, {"Open the file.": "Q7mem named open."}, memory_id="deepl-tm")
    named = client.post(
        "/v2/translate",
        json={"text": [A], "target_lang": "DE", "translation_memory_id": "deepl-tm"},
    )
    assert named.json()["translations"][0]["text"] == "Q7mem named open."
    events = client.post("/v1/translate/stream", json={"text": f"{A} {C}"}).text
    done = [json.loads(line[6:]) for line in events.splitlines() if line.startswith("data: {")]
    assert any(e.get("translation") == "Q7mem Datei öffnen." for e in done), events


def test_uploads_listing_entries_and_delete(client):
    created = client.post(
        "/v1/memories",
        data={"source_lang": "EN", "target_lang": "de", "memory_id": "upload"},
        files={"file": ("tm.tsv", b"Print.\tQ7mem drucken.\nCopy.\tQ7mem kopieren.\n")},
    )
    assert created.status_code == 201, created.text
    assert created.json()["entry_count"] == 2 and created.json()["source_lang"] == "en"
    csv_post = client.post(
        "/v1/memories",
        data={"source_lang": "en", "target_lang": "de", "memory_id": "upload"},
        files={"file": ("tm.csv", b'"Paste, then save.",Q7mem einf\xc3\xbcgen.\n')},
    )
    assert csv_post.status_code == 200 and csv_post.json()["added"] == 1
    assert client.get("/v1/memories/upload/entries").json()["entries"] == [
        ["Copy.", "Q7mem kopieren."],
        ["Paste, then save.", "Q7mem einfügen."],
        ["Print.", "Q7mem drucken."],
    ]
    assert "upload" in [m["memory_id"] for m in client.get("/v1/memories").json()["memories"]]
    out = client.post("/v1/translate", json={"text": "Print. Copy.", "memory_id": "upload"})
    assert out.json()["translations"][0]["text"] == "Q7mem drucken. Q7mem kopieren."
    assert client.delete("/v1/memories/upload").status_code == 204
    assert client.get("/v1/memories/upload").status_code == 404
    gone = client.post("/v1/translate", json={"text": "Print.", "memory_id": "upload"})
    assert gone.status_code == 404


@pytest.mark.parametrize(
    ("fields", "status", "code"),
    [
        ({"entries": {"": "x"}}, 400, "empty_memory_segment"),
        ({"entries": [["a", "x"], ["a", "y"]]}, 400, "conflicting_memory_entries"),
        ({"entries": {"a": "x"}, "target_lang": "en"}, 400, "memory_same_language"),
        ({"entries": {"a": "x"}, "target_lang": "ja"}, 400, None),
        ({"entries": {"a": "x"}, "memory_id": "bad id"}, 400, "invalid_memory_id"),
        ({"entries": "only one field\n"}, 400, None),
        ({"entries": {"a": 3}}, 400, "invalid_request"),
        ({"entries": {"a": "x" * 6000}}, 413, "memory_segment_too_long"),
    ],
)
def test_bad_posts_are_clear_4xx_and_store_nothing(client, fields, status, code):
    before = client.get("/v1/memories").json()
    body = {"source_lang": "en", "target_lang": "de", **fields}
    response = client.post("/v1/memories", json=body)
    assert response.status_code == status, response.text
    assert code is None or response.json()["code"] == code
    assert client.get("/v1/memories").json() == before


def test_memories_survive_a_restart(model_dir, tmp_path):
    settings = make_settings(model_dir, tmp_path / "data")
    with TestClient(create_app(settings)) as first:
        wait_ready(first)
        post(first, {"Save the changes.": "Q7mem kept."})
        post(first, {"Close the window.": "Q7mem named kept."}, memory_id="kept")
    with TestClient(create_app(settings)) as second:
        wait_ready(second)
        ids = sorted(m["memory_id"] for m in second.get("/v1/memories").json()["memories"])
        assert ids == ["default:en-de", "kept"]
        out = second.post("/v1/translate", json={"text": f"{B} {C}", "memory_id": "kept"})
        assert out.json()["translations"][0]["text"].endswith(" Q7mem named kept.")
        default = second.post("/v1/translate", json={"text": B}).json()
        assert default["translations"][0]["text"] == "Q7mem kept."


# --- a pivot -----------------------------------------------------------------------------------


def test_a_pivot_uses_the_memory_of_the_requested_pair(tmp_path_factory, tmp_path):
    """de->fr runs de->en->fr; the de->fr memory answers before either model runs."""
    dirs = language_models(tmp_path_factory)
    settings = Settings(
        exports=list(dirs.values()),
        provider="cpu",
        intra_op_threads=1,
        max_new_tokens=24,
        data_dir=tmp_path,
        translation_cache_size=0,
    )
    with TestClient(create_app(settings)) as pivot:
        wait_ready(pivot)
        body = {"source_lang": "de", "target_lang": "fr", "entries": {"Datei öffnen.": "Q7fr"}}
        assert pivot.post("/v1/memories", json=body).status_code == 201
        request = {"text": "Datei öffnen. Fenster schließen.", "source_lang": "de"}
        off = pivot.post(
            "/v1/translate",
            json={"text": "Fenster schließen.", "source_lang": "de", "target_lang": "fr"},
        ).json()
        out = pivot.post("/v1/translate", json={**request, "target_lang": "fr"}).json()
        assert out["models"] and len(out["models"]) == 2  # both legs ran for the rest
        assert out["translations"][0]["text"] == f"Q7fr {off['translations'][0]['text']}"
        assert out["usage"]["memory_sentences"] == 1
        # The same sentence to en (a direct model) is not in any memory.
        to_en = pivot.post("/v1/translate", json={**request, "target_lang": "en"}).json()
        assert "Q7fr" not in to_en["translations"][0]["text"]


def test_a_request_asks_the_store_for_its_memory_once(client, monkeypatch):
    asked = []
    lookup = MemoryStore.lookup

    def counting(self, choice, source_lang, target_lang):
        asked.append((source_lang, target_lang))
        return lookup(self, choice, source_lang, target_lang)

    monkeypatch.setattr(MemoryStore, "lookup", counting)
    response = client.post("/v1/translate", json={"text": "Open the file."})
    assert response.status_code == 200, response.text
    assert asked == [("en", "de")]
