"""Both process modes serve pastes of the character limit, four at once, to an idle server:
the engine core's queue is sized one way (service/engine_core/core.py) whichever process
holds it, and a busy engine core is not taken for a hung one."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.servers import serving
from tests.service_fixtures import tiny_model

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

VERBS = ["Cut", "Add", "Set", "Run"]


def paste_of(verb: str) -> str:
    """500 short sentences, 4,499 characters, none like another (nothing cached): what a user
    pastes from a list of UI strings."""
    return " ".join(f"{verb} {number}." for number in range(100, 600))


@pytest.fixture(scope="module")
def service(process_mode, tmp_path_factory):
    model_dir = tiny_model(tmp_path_factory)
    workdir = tmp_path_factory.mktemp("pastes")
    with serving(process_mode, workdir, exports=[model_dir], max_new_tokens=8) as served:
        yield served


def test_four_simultaneous_pastes_of_4500_characters_are_served(service):
    assert {len(paste_of(verb)) for verb in VERBS} == {4499}

    def paste(verb: str):
        return service.client.post("/v1/translate", json={"text": paste_of(verb)}, timeout=120)

    with ThreadPoolExecutor(len(VERBS)) as pool:
        responses = list(pool.map(paste, VERBS))
    for response in responses:
        assert response.status_code == 200, f"{response.text}\n{service.log()[-3000:]}"
        [translation] = response.json()["translations"]
        assert translation["sentences"] == 500
