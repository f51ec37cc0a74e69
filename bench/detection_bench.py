"""Language detection (service/translation/detection.py, py3langid): load time, memory, latency, accuracy.

    .venv/bin/python bench/detection_bench.py [--languages en,de,fr] [--corpus build/corpus]
        [--repeats 2000]

* load: seconds and resident-memory growth of the process to build the detector (a fresh
  interpreter with numpy already imported, as in the service), measured in a subprocess;
* latency: microseconds per ``detect`` call for a short UI string, a sentence and a paragraph,
  restricted to ``--languages`` and, for comparison, over all 142 languages of the model;
* accuracy (with ``--corpus``): the share of the test split's English sources detected as
  ``en`` and of its German references detected as ``de``, detecting among ``--languages``.

Prints a table and writes JSON to bench/results/detection.json. Run it alone on the machine
(``flock -x /tmp/cpu.lock``): latency figures are wall-clock.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from service.translation.detection import LanguageDetector  # noqa: E402

TEXTS = {
    "short (2 words)": "Save changes",
    "sentence (9 words)": "The selected file could not be opened in a new window.",
    "paragraph (~480 chars)": (
        "Das Programm konnte die Einstellungen nicht speichern, weil der Ordner schreibgeschützt "
        "ist. Bitte wählen Sie einen anderen Speicherort oder ändern Sie die Berechtigungen des "
        "Ordners. Wenn das Problem weiterhin besteht, wenden Sie sich an Ihren Administrator. "
        "Alle nicht gespeicherten Änderungen gehen verloren, wenn Sie das Programm jetzt beenden. "
        "Möchten Sie die Änderungen in einer neuen Datei speichern, bevor Sie fortfahren?"
    ),
}

_LOAD_PROBE = """
import json, os, sys, time
import numpy  # the service has it loaded already
def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
sys.path.insert(0, {root!r})
before, started = rss(), time.perf_counter()
from service.translation.detection import LanguageDetector
detector = LanguageDetector({languages!r})
seconds = time.perf_counter() - started
detector.detect("warm up")
print(json.dumps({{"seconds": seconds, "rss_growth_bytes": rss() - before}}))
"""


def measure_load(languages: list[str]) -> dict:
    root = str(Path(__file__).resolve().parents[1])
    probe = _LOAD_PROBE.format(root=root, languages=languages)
    output = subprocess.run(
        [sys.executable, "-c", probe], check=True, capture_output=True, text=True
    ).stdout
    return json.loads(output.strip().splitlines()[-1])


def latency_us(detector: LanguageDetector, text: str, repeats: int) -> dict:
    for _ in range(20):
        detector.detect(text)
    samples = []
    for _ in range(repeats):
        started = time.perf_counter()
        detector.detect(text)
        samples.append((time.perf_counter() - started) * 1e6)
    samples.sort()
    return {
        "median_us": round(statistics.median(samples), 1),
        "p99_us": round(samples[int(0.99 * (len(samples) - 1))], 1),
    }


def accuracy(detector: LanguageDetector, corpus: Path) -> dict:
    lines = (corpus / "test.tsv").read_text(encoding="utf-8").splitlines()[1:]
    rows = [line.split("\t") for line in lines]
    english = [row[0] for row in rows]
    german = [row[1] for row in rows]
    return {
        "test_pairs": len(rows),
        "en_sources_detected_en": round(
            sum(detector.detect(t)[0].language == "en" for t in english) / len(english), 4
        ),
        "de_references_detected_de": round(
            sum(detector.detect(t)[0].language == "de" for t in german) / len(german), 4
        ),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--languages", default="en,de,fr")
    parser.add_argument("--corpus", type=Path, default=None)
    parser.add_argument("--repeats", type=int, default=2000)
    parser.add_argument("--output", type=Path, default=Path("bench/results/detection.json"))
    args = parser.parse_args(argv)
    languages = args.languages.split(",")

    restricted = LanguageDetector(languages)
    everything = LanguageDetector(_all_languages())
    result: dict = {
        "machine": platform.processor() or platform.machine(),
        "python": platform.python_version(),
        "languages": languages,
        "load": measure_load(languages),
        "latency": {
            name: {
                "restricted": latency_us(restricted, text, args.repeats),
                "all_142": latency_us(everything, text, args.repeats),
            }
            for name, text in TEXTS.items()
        },
    }
    if args.corpus is not None:
        result["accuracy"] = accuracy(restricted, args.corpus)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=2) + "\n")

    load = result["load"]
    print(f"load: {load['seconds']:.2f} s, +{load['rss_growth_bytes'] / 2**20:.1f} MiB resident")
    print(f"{'text':<24} {'restricted median/p99 µs':>26} {'all 142 median/p99 µs':>24}")
    for name, row in result["latency"].items():
        ours, full = row["restricted"], row["all_142"]
        print(
            f"{name:<24} {ours['median_us']:>14.1f} / {ours['p99_us']:<9.1f}"
            f" {full['median_us']:>12.1f} / {full['p99_us']:<9.1f}"
        )
    if "accuracy" in result:
        print(json.dumps(result["accuracy"]))


def _all_languages() -> list[str]:
    from py3langid.langid import MODEL_FILE, LanguageIdentifier

    return LanguageIdentifier.from_model_file(MODEL_FILE).labels


if __name__ == "__main__":
    main()
