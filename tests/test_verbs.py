"""``python -m service --help``: one help that lists every verb (service/verbs.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from service.__main__ import main
from service.verbs import VERBS, serve_argv

ROOT = Path(__file__).resolve().parents[1]


def test_help_lists_serve_models_translate_and_models_pull():
    done = subprocess.run(
        [sys.executable, "-m", "service", "--help"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
    )
    assert done.returncode == 0, done.stderr
    for verb in ("serve", "models", "translate"):
        assert f"\n  {verb} " in done.stdout
    assert "models pull" in done.stdout and "make pull" in done.stdout
    assert "--port" in done.stdout  # the server's own flags, in the same help


def test_every_verb_dispatches(capsys):
    assert [verb for verb, _ in VERBS] == ["serve", "models", "translate"]
    for verb in ("models", "translate"):
        with pytest.raises(SystemExit) as exited:
            main([verb, "--help"])
        assert exited.value.code == 0
        assert f"python -m service {verb}" in capsys.readouterr().out


def test_serve_is_the_default_verb():
    assert serve_argv(["serve", "--port", "9000"]) == ["--port", "9000"]
    assert serve_argv(["--port", "9000"]) == ["--port", "9000"]
