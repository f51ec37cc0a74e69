"""bench/framework_floor.py's bare arm answers the load's requests in mtserve's response model."""

from __future__ import annotations

from fastapi.testclient import TestClient

from bench.framework_floor import app
from service.web.schemas import TranslateResponse


def test_the_bare_arm_echoes_the_text_in_mtserves_response_model():
    payload = {"text": "Save changes", "source_lang": "en", "target_lang": "de"}
    with TestClient(app) as client:
        response = client.post("/v1/translate", json=payload)
        refused = client.post("/v1/translate", json={"text": "no languages"})
    assert response.status_code == 200
    body = TranslateResponse.model_validate(response.json())
    assert body.translations[0].text == "Save changes"
    assert (body.source_lang, body.target_lang) == ("en", "de")
    assert refused.status_code == 422  # the request model is validated, as mtserve's is
