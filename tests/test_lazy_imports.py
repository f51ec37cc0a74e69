"""A module a process imports and never uses costs it memory for its whole life: the
supervisor of multi-process mode holds neither the engine nor the app (it only starts and
watches the processes that do), and language detection reads wordfreq's lists without
importing wordfreq (and its tokenizers' dependencies)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def imported_after(code: str) -> set[str]:
    """The modules a fresh interpreter holds after running ``code``."""
    probe = f"import json, sys\n{code}\nprint(json.dumps(sorted(sys.modules)))"
    output = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    return set(json.loads(output.splitlines()[-1]))


def test_the_supervisor_imports_neither_the_engine_nor_the_app():
    modules = imported_after("import service.__main__, service.processes.supervisor")
    engine_and_app = {
        "numpy",
        "onnxruntime",
        "service.wiring",
        "service.web.app",
        "service.runtime.engine",
        "service.scheduling.batcher",
        "service.engine_core.server",
    }
    assert not engine_and_app & modules


def test_the_supervisor_asks_whether_it_has_a_gpu_without_importing_onnx_runtime():
    modules = imported_after(
        "from service.processes.supervisor import uses_gpu\nassert uses_gpu('auto') in (True, False)"
    )
    assert "onnxruntime" not in modules and "numpy" not in modules


def test_reading_the_word_lists_does_not_import_wordfreq():
    modules = imported_after(
        "from service.translation.word_lists import word_log_frequencies\n"
        "assert word_log_frequencies('en') is not None"
    )
    assert "wordfreq" not in modules and "langcodes" not in modules
