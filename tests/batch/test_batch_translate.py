"""Translation without a server (service/batch): the Python call and
``python -m service translate``, on the tiny real model of tests/service_fixtures.py, against
what the server answers for the same texts."""

from __future__ import annotations

import io
import sys
import time

import polib
import pytest
from fastapi.testclient import TestClient

import service.batch
import service.batch.progress
from service.batch import BatchTranslator, UnsupportedLanguage
from service.batch.cli import main
from service.batch.models import shipped_exports
from service.config import Settings, get_settings
from service.wiring import create_app
from tests.service_fixtures import tiny_model

# One sentence a line, as a .txt file holds them; a blank line and a placeholder among them.
LINES = [
    "Save the file.",
    "Open a new window and close the old one.",
    "",
    "Delete %s files?",
    "The settings were saved. Print the changes.",
]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return tiny_model(tmp_path_factory)


@pytest.fixture(autouse=True)
def one_thread(monkeypatch):
    """The command reads the environment's settings: one engine thread on these machines."""
    monkeypatch.setenv("MT_INTRA_OP_THREADS", "1")
    monkeypatch.setenv("MT_PROVIDER", "cpu")
    get_settings.cache_clear()
    yield
    get_settings.cache_clear()


def settings(model_dir) -> Settings:
    return Settings(exports=[model_dir], provider="cpu", intra_op_threads=1)


@pytest.fixture(scope="module")
def served(model_dir):
    """The server's translations of ``texts`` (LibreTranslate's /translate, one request)."""
    with TestClient(create_app(settings(model_dir))) as client:
        for _ in range(600):
            if client.get("/ready").status_code == 200:
                break
            time.sleep(0.05)

        def translate(texts: list[str]) -> list[str]:
            response = client.post("/translate", json={"q": texts, "source": "en", "target": "de"})
            assert response.status_code == 200, response.text
            return response.json()["translatedText"]

        yield translate


@pytest.fixture(scope="module")
def batch(model_dir):
    with BatchTranslator(settings(model_dir)) as translator:
        yield translator


def run(argv: list[str], monkeypatch, capsys, stdin: bytes = b"") -> tuple[int, str, str]:
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(stdin), encoding="utf-8"))
    status = main(argv)
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def test_the_python_call_translates_as_the_server_does(batch, served):
    texts = [line for line in LINES if line]
    assert batch.translate(texts, "en", "de") == served(texts)
    assert batch.translate(texts[0], "en", "de") == served(texts[:1])[0]


def test_many_texts_go_in_several_chunks_and_come_back_in_order(batch, served, monkeypatch):
    monkeypatch.setattr(service.batch, "CHUNK_CHARS", 40)  # a chunk of a text or two
    texts = [line for line in LINES if line] * 6
    assert batch.translate(texts, "en", "de") == served(texts)


def test_the_module_function_loads_the_models_once(model_dir, monkeypatch, served):
    monkeypatch.setenv("MT_EXPORTS", str(model_dir))
    get_settings.cache_clear()
    monkeypatch.setattr(service.batch, "_shared", None)
    first = service.batch.translate(["Save the file."], "en", "de")
    shared = service.batch._shared
    assert service.batch.translate("Save the file.", "en", "de") == first[0]
    assert service.batch._shared is shared
    assert first == served(["Save the file."])
    shared.close()


def test_an_unserved_pair_is_refused_naming_the_served_ones(batch):
    with pytest.raises(UnsupportedLanguage, match=r"fr is not supported \(served: en→de\)"):
        batch.translate(["Save"], "en", "fr")


def test_stdin_lines_are_translated_to_stdout(model_dir, monkeypatch, capsys, served):
    stdin = "\n".join(LINES) + "\n"
    status, out, err = run(
        ["--source", "en", "--target", "de", "--model-dir", str(model_dir)],
        monkeypatch,
        capsys,
        stdin.encode(),
    )
    assert status == 0, err
    wanted = served([line for line in LINES if line])
    assert out.splitlines() == [wanted.pop(0) if line else "" for line in LINES]


def test_a_txt_file_is_written_beside_it_with_the_target_code(
    model_dir, tmp_path, monkeypatch, capsys, served
):
    source = tmp_path / "notes.txt"
    source.write_text("\n".join(LINES) + "\n", encoding="utf-8")
    status, out, err = run(
        ["-s", "en", "-t", "de", "--model-dir", str(model_dir), str(source)], monkeypatch, capsys
    )
    assert status == 0, err
    assert out == ""
    written = (tmp_path / "notes.de.txt").read_text(encoding="utf-8")
    wanted = served([line for line in LINES if line])
    assert written.splitlines() == [wanted.pop(0) if line else "" for line in LINES]


POT = """msgid ""
msgstr ""
"Content-Type: text/plain; charset=UTF-8\\n"

#, python-format
msgid "Delete %s files?"
msgstr ""

msgid "Save the file."
msgstr ""

msgid "Print"
msgstr "Drucken"
"""


def test_a_po_template_becomes_a_fuzzy_po_catalog(model_dir, tmp_path, monkeypatch, capsys, served):
    (tmp_path / "app.pot").write_text(POT, encoding="utf-8")
    out_dir = tmp_path / "out"
    status, _, err = run(
        ["-s", "en", "-t", "de", "--model-dir", str(model_dir), "-o", str(out_dir)]
        + [str(tmp_path / "app.pot"), str(tmp_path / "app.pot")],
        monkeypatch,
        capsys,
    )
    assert status == 0, err
    catalog = polib.pofile(str(out_dir / "app.po"))
    entries = {entry.msgid: entry for entry in catalog}
    assert entries["Print"].msgstr == "Drucken"  # translated already: left alone
    wanted = served(["Delete %s files?", "Save the file."])
    assert [entries["Delete %s files?"].msgstr, entries["Save the file."].msgstr] == wanted
    assert "fuzzy" in entries["Save the file."].flags
    assert "python-format" in entries["Delete %s files?"].flags
    assert catalog.metadata["Language"] == "de"


def test_stdin_read_as_another_format(model_dir, monkeypatch, capsys, served):
    status, out, err = run(
        ["-s", "en", "-t", "de", "--model-dir", str(model_dir), "--format", "po"],
        monkeypatch,
        capsys,
        POT.encode(),
    )
    assert status == 0, err
    [entry] = [e for e in polib.pofile(out) if e.msgid == "Save the file."]
    assert entry.msgstr == served(["Save the file."])[0]


def test_an_unknown_pair_exits_2_with_a_message_and_writes_nothing(
    model_dir, tmp_path, monkeypatch, capsys
):
    source_file = tmp_path / "notes.txt"
    source_file.write_text("Save the file.\n", encoding="utf-8")
    for source, target, message in (
        ("en", "fr", "fr is not supported"),
        ("de", "en", "English (en) is not available as a target language from German (de)"),
    ):
        argv = ["-s", source, "-t", target, "--model-dir", str(model_dir), str(source_file)]
        status, out, err = run(argv, monkeypatch, capsys)
        assert status == 2
        assert message in err and "served: en→de" in err
        assert out == ""
    assert sorted(path.name for path in tmp_path.iterdir()) == ["notes.txt"]


def test_a_missing_file_or_an_unknown_format_exits_2(model_dir, tmp_path, monkeypatch, capsys):
    (tmp_path / "data.csv").write_text("a,b\n")
    for name, message in (("missing.txt", "no such file"), ("data.csv", "not supported")):
        argv = ["-s", "en", "-t", "de", "--model-dir", str(model_dir), str(tmp_path / name)]
        status, _, err = run(argv, monkeypatch, capsys)
        assert status == 2 and message in err


def test_the_progress_bar_goes_to_stderr(model_dir, monkeypatch, capsys):
    monkeypatch.setattr(service.batch.progress, "PROGRESS_DELAY_S", 0.0)
    argv = ["-s", "en", "-t", "de", "--model-dir", str(model_dir), "--progress"]
    status, out, err = run(argv, monkeypatch, capsys, b"Save the file.\n")
    assert status == 0
    assert "100%" in err and "char" in err
    assert "%" not in out


def test_the_shipped_exports_are_those_of_the_shipped_models(tmp_path):
    # make serve serves build/onnx/NAME for each models/NAME with weights; another export
    # there (an int8 variant of the same model) is not a second model of its pair.
    for name in ("default", "de-en"):
        (tmp_path / "models" / name).mkdir(parents=True)
        (tmp_path / "models" / name / "model.safetensors").write_bytes(b"")
    for name in ("default", "default-int8", "de-en"):
        (tmp_path / "build" / "onnx" / name).mkdir(parents=True)
        (tmp_path / "build" / "onnx" / name / "decoder.onnx").write_bytes(b"")
    found = shipped_exports(tmp_path)
    assert found == [tmp_path / "build" / "onnx" / name for name in ("de-en", "default")]
