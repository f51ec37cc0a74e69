"""With API keys on, one key neither reads nor changes what another stored: glossaries,
memories (the pair's default included) and document jobs are their owner's; what an admin key
stores is shared and read-only for the others. Without keys everything stays shared.
"""

from __future__ import annotations

import time

import pytest
from fastapi.testclient import TestClient

from service.config import Settings
from service.wiring import create_app
from tests.service_fixtures import tiny_model

KEY_A, KEY_B, ADMIN = "key-a", "key-b", "key-admin"
TEXT = "Save changes"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return tiny_model(tmp_path_factory)


@pytest.fixture(scope="module")
def client(model_dir, tmp_path_factory):
    settings = Settings(
        exports=[model_dir],
        provider="cpu",
        intra_op_threads=1,
        max_new_tokens=8,
        translation_cache_size=0,
        data_dir=tmp_path_factory.mktemp("isolation_data"),
        api_keys=f"{KEY_A},{KEY_B}",
        admin_api_keys=ADMIN,
    )
    with TestClient(create_app(settings)) as test_client:
        for _ in range(3000):
            if test_client.get("/ready").status_code == 200:
                break
            time.sleep(0.01)
        yield test_client


def as_key(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def translations(client: TestClient, key: str) -> dict[str, str]:
    """``TEXT`` through each API, as ``key``."""
    v1 = client.post("/v1/translate", json={"text": TEXT}, headers=as_key(key))
    libre = client.post(
        "/translate", json={"q": TEXT, "source": "en", "target": "de", "api_key": key}
    )
    v2 = client.post(
        "/v2/translate",
        json={"text": [TEXT], "source_lang": "EN", "target_lang": "DE"},
        headers={"Authorization": f"DeepL-Auth-Key {key}"},
    )
    for response in (v1, libre, v2):
        assert response.status_code == 200, response.text
    return {
        "v1": v1.json()["translations"][0]["text"],
        "translate": libre.json()["translatedText"],
        "v2": v2.json()["translations"][0]["text"],
    }


def test_another_keys_default_memory_does_not_change_a_translation(client):
    before = translations(client, KEY_A)
    posted = client.post(
        "/v1/memories",
        json={"source_lang": "en", "target_lang": "de", "entries": {TEXT: "Alle Daten löschen"}},
        headers=as_key(KEY_B),
    )
    assert posted.status_code == 201, posted.text
    assert translations(client, KEY_A) == before
    assert set(translations(client, KEY_B).values()) == {"Alle Daten löschen"}
    # B's memory is B's: A neither lists nor reads it, though both call it default:en-de.
    listed = client.get("/v1/memories", headers=as_key(KEY_A)).json()["memories"]
    assert listed == []
    assert client.get("/v1/memories/default:en-de", headers=as_key(KEY_A)).status_code == 404
    assert client.delete("/v1/memories/default:en-de", headers=as_key(KEY_A)).status_code == 404
    assert client.get("/v1/memories/default:en-de", headers=as_key(KEY_B)).status_code == 200


def test_a_keys_named_memory_is_404_to_another_key(client):
    body = {"source_lang": "en", "target_lang": "de", "entries": {"Open": "Q7a"}}
    body["memory_id"] = "project"
    assert client.post("/v1/memories", json=body, headers=as_key(KEY_A)).status_code == 201
    for path in ("/v1/memories/project", "/v1/memories/project/entries"):
        assert client.get(path, headers=as_key(KEY_B)).status_code == 404
    named = client.post(
        "/v1/translate", json={"text": "Open", "memory_id": "project"}, headers=as_key(KEY_B)
    )
    assert named.status_code == 404
    # The same name is free for B: its own memory, not A's.
    body["entries"] = {"Open": "Q7b"}
    assert client.post("/v1/memories", json=body, headers=as_key(KEY_B)).status_code == 201
    entries = client.get("/v1/memories/project/entries", headers=as_key(KEY_A)).json()
    assert entries["entries"] == [["Open", "Q7a"]]


def test_a_glossary_is_its_owners_on_both_apis(client):
    created = client.post(
        "/v1/glossaries",
        json={"name": "a", "source_lang": "en", "target_lang": "de", "entries": {"save": "X"}},
        headers=as_key(KEY_A),
    )
    assert created.status_code == 201, created.text
    glossary_id = created.json()["glossary_id"]
    b, deepl_b = as_key(KEY_B), {"Authorization": f"DeepL-Auth-Key {KEY_B}"}
    assert client.get("/v1/glossaries", headers=b).json()["glossaries"] == []
    assert client.get("/v2/glossaries", headers=deepl_b).json()["glossaries"] == []
    for path in (f"/v1/glossaries/{glossary_id}", f"/v2/glossaries/{glossary_id}/entries"):
        assert client.get(path, headers=b).status_code == 404, path
    assert client.delete(f"/v1/glossaries/{glossary_id}", headers=b).status_code == 404
    used = client.post("/v1/translate", json={"text": TEXT, "glossary_id": glossary_id}, headers=b)
    assert used.status_code == 404
    listed = client.get("/v1/glossaries", headers=as_key(KEY_A)).json()["glossaries"]
    assert [g["glossary_id"] for g in listed] == [glossary_id]


def test_what_an_admin_key_stores_is_shared_and_read_only(client):
    created = client.post(
        "/v1/glossaries",
        json={"name": "house", "source_lang": "en", "target_lang": "de", "entries": {"a": "b"}},
        headers=as_key(ADMIN),
    )
    glossary_id = created.json()["glossary_id"]
    for key in (KEY_A, KEY_B):
        assert client.get(f"/v1/glossaries/{glossary_id}", headers=as_key(key)).status_code == 200
    refused = client.delete(f"/v1/glossaries/{glossary_id}", headers=as_key(KEY_B))
    assert refused.status_code == 403 and "read-only" in refused.json()["error"]
    memory = {"source_lang": "en", "target_lang": "de", "entries": {"Close": "Q7shared"}}
    assert client.post("/v1/memories", json=memory, headers=as_key(ADMIN)).status_code == 201
    closed = client.post("/v1/translate", json={"text": "Close"}, headers=as_key(KEY_A))
    assert closed.json()["translations"][0]["text"] == "Q7shared"  # applies to every key
    refused = client.delete("/v1/memories/default:en-de", headers=as_key(KEY_A))
    assert refused.status_code == 403  # A has no default of its own: this is the shared one
    assert client.delete(f"/v1/glossaries/{glossary_id}", headers=as_key(ADMIN)).status_code == 204


def test_a_document_job_is_its_uploaders_and_v2_needs_its_key(client):
    upload = client.post(
        "/v2/document",
        data={"target_lang": "DE", "source_lang": "EN"},
        files={"file": ("a.txt", b"Save changes", "text/plain")},
        headers={"Authorization": f"DeepL-Auth-Key {KEY_A}"},
    )
    assert upload.status_code == 200, upload.text
    job = upload.json()
    document_id, document_key = job["document_id"], job["document_key"]
    for path in (f"/v1/documents/{document_id}", f"/v1/documents/{document_id}/result"):
        assert client.get(path, headers=as_key(KEY_B)).status_code == 404, path
    assert client.delete(f"/v1/documents/{document_id}", headers=as_key(KEY_B)).status_code == 404
    # Even with the document key, another API key does not open it.
    other = client.post(
        f"/v2/document/{document_id}",
        data={"document_key": document_key},
        headers={"Authorization": f"DeepL-Auth-Key {KEY_B}"},
    )
    assert other.status_code == 404
    own = client.get(f"/v1/documents/{document_id}", headers=as_key(KEY_A))
    assert own.status_code == 200
