"""/docs groups the operations by API: every operation in /openapi.json has exactly one of
the service's tags, and none is left under Swagger UI's "default"."""

from __future__ import annotations

from fastapi.testclient import TestClient

from service.config import Settings
from service.wiring import create_app

TAGS = {
    "native",
    "LibreTranslate",
    "DeepL",
    "documents",
    "glossaries and memories",
    "operations",
}
METHODS = {"get", "post", "put", "patch", "delete"}


def test_every_operation_has_exactly_one_of_the_api_tags(tmp_path):
    # No model is needed to describe the API: a directory without one serves the schema.
    app = create_app(Settings(exports=[tmp_path / "none"], data_dir=tmp_path / "data"))
    schema = TestClient(app).get("/openapi.json").json()
    tags = {
        f"{method.upper()} {path}": operation.get("tags", [])
        for path, item in schema["paths"].items()
        for method, operation in item.items()
        if method in METHODS
    }
    assert len(tags) > 30
    wrong = {operation: found for operation, found in tags.items() if len(found) != 1}
    assert not wrong, wrong
    assert {found[0] for found in tags.values()} == TAGS
    assert tags["POST /v1/translate"] == ["native"]
    assert tags["POST /translate"] == ["LibreTranslate"]
    assert tags["POST /v2/translate"] == ["DeepL"]
    assert tags["GET /ready"] == ["operations"]
    assert {tag["name"] for tag in schema["tags"]} == TAGS  # described in /docs
