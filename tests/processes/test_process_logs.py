"""Both process modes start their servers one way (service/web/server.py): with
``MT_LOG_FORMAT=json`` every line that any process of the service writes is one JSON object,
the requests' records included."""

from __future__ import annotations

import json

import pytest

from tests.servers import MODES, child_service
from tests.service_fixtures import tiny_model

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return tiny_model(tmp_path_factory)


@pytest.mark.parametrize("mode", MODES)
def test_json_logs_are_json_in_both_process_modes(model_dir, tmp_path, mode):
    """The service as ``python -m service`` starts it, in each mode (a child process)."""
    settings = dict(model_dir=model_dir, process_mode=mode, log_format="json", log_level="info")
    with child_service(tmp_path, access_log=True, **settings) as served:
        response = served.client.post("/v1/translate", json={"text": "Save the file."})
        assert response.status_code == 200, response.text
        request_id = response.headers["x-request-id"]
    lines = [line for line in served.log().splitlines() if line.strip()]
    records = []
    for line in lines:
        try:
            records.append(json.loads(line))
        except ValueError:
            raise AssertionError(f"a line of the {mode} log is not JSON: {line!r}") from None
    [served_record] = [
        r for r in records if r["logger"] == "mtserve.requests" and r["route"] == "/v1/translate"
    ]
    assert served_record["status"] == 200 and served_record["request_id"] == request_id
    assert any(r["logger"].startswith("uvicorn") for r in records)  # uvicorn's lines too
    if mode == "multi":  # the supervisor's, the front-end's and the engine core's lines
        assert len({r["pid"] for r in records}) >= 3
