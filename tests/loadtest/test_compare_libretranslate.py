"""loadtest/compare_libretranslate.py without LibreTranslate: the Argos package's metadata,
the per-pair ratios, and the memory of a whole process tree."""

from __future__ import annotations

import subprocess
import sys
import time

from loadtest.compare_libretranslate import (
    argos_env,
    package_metadata,
    summarise,
    tree_memory,
)


def test_the_argos_package_names_the_models_pair():
    metadata = package_metadata("en", "de", "default")
    assert (metadata["from_code"], metadata["to_code"], metadata["type"]) == (
        "en",
        "de",
        "translate",
    )
    assert (metadata["from_name"], metadata["to_name"]) == ("English", "German")


def test_libretranslate_runs_offline_on_one_thread_in_its_own_folders(tmp_path):
    env = argos_env(tmp_path)
    assert env["ARGOS_CHUNK_TYPE"] == "SPACY" and env["ARGOS_INTRA_THREADS"] == "1"
    assert all(
        env[k].startswith(str(tmp_path)) for k in ("HOME", "XDG_DATA_HOME", "XDG_CACHE_HOME")
    )


def test_each_pair_gives_its_own_ratio_and_the_range_spans_them():
    def arm(rps, p50, p99):
        return {"rps": rps, "p50_ms": p50, "p99_ms": p99}

    pairs = [
        {"ours": arm(300, 100, 150), "libretranslate": arm(150, 200, 260)},
        {"ours": arm(240, 100, 200), "libretranslate": arm(160, 200, 250)},
    ]
    summary = summarise(pairs)
    assert summary["capacity_ratio"] == [2.0, 1.5]
    assert summary["capacity_ratio_range"] == [1.5, 2.0]
    assert summary["p99_ratio"] == [round(150 / 260, 3), 0.8]
    assert summary["p99_over_p50"] == {"ours": [1.5, 2.0], "libretranslate": [1.3, 1.25]}


def test_the_memory_of_a_server_counts_its_child_processes():
    code = "import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(30)']); time.sleep(30)"
    parent = subprocess.Popen([sys.executable, "-c", code])
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            found = tree_memory(parent.pid)
            if len(found["processes"]) == 2:
                break
            time.sleep(0.1)
        assert len(found["processes"]) == 2
        assert found["rss_mb"] >= sum(p["rss_mb"] for p in found["processes"]) - 0.2
        assert found["rss_mb"] > 0 and 0 < found["pss_mb"] <= found["rss_mb"]
    finally:
        for process in found["processes"][::-1]:
            subprocess.run(["kill", str(process["pid"])], check=False)
        parent.wait(10)
