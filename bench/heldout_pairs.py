"""Held-out translation pairs (English, German) from the catalogs of bench/heldout.

    .venv/bin/python bench/heldout_pairs.py WHEEL...   # rebuild bench/heldout/ui_pairs_en_de.json

The same two wheels and the same filters as bench/detection.py's held-out strings (translated,
not fuzzy, not plural; whitespace normalised; no markup or URLs; at least one word of two
letters outside placeholders), kept as pairs: the references that a quality check needs (the
int8 check of the export, export/int8_check.py; the real-workload peers benchmark,
bench/real_peers.py). Pairs whose English occurs twice with different German keep the first.
"""

from __future__ import annotations

import argparse
import json
import sys
import zipfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.detection import LONG_CHARS, SOURCES, _normalised, _usable  # noqa: E402

PAIRS = Path(__file__).resolve().parent / "heldout" / "ui_pairs_en_de.json"


def extract_pairs(wheels: list[Path]) -> dict:
    import polib

    packages: dict = {}
    for wheel in wheels:
        name = next(n for n in SOURCES if wheel.name.startswith(n.replace("-", "_") + "-"))
        version, _, catalog = SOURCES[name]
        assert f"-{version}-" in wheel.name, (wheel, version)
        with zipfile.ZipFile(wheel) as archive:
            po = polib.pofile(archive.read(catalog).decode("utf-8"))
        seen: dict[str, str] = {}
        for entry in po:
            if not entry.msgstr or entry.fuzzy or entry.obsolete or entry.msgid_plural:
                continue
            english, german = _normalised(entry.msgid), _normalised(entry.msgstr)
            if _usable(english) and _usable(german) and english != german:
                seen.setdefault(english, german)
        pairs = sorted(seen.items())
        packages[name] = {
            "short": [list(p) for p in pairs if len(p[0]) < LONG_CHARS],
            "long": [list(p) for p in pairs if len(p[0]) >= LONG_CHARS],
        }
    return {
        "about": "Held-out (English, German) pairs for quality checks (bench/heldout_pairs.py "
        "says how they were chosen). Strings of the projects below, under their licences.",
        "sources": {
            name: {"version": version, "licence": licence, "catalog": catalog}
            for name, (version, licence, catalog) in SOURCES.items()
            if name in packages
        },
        "pairs": packages,
    }


def compact_json(found: dict) -> str:
    """The pairs file with one pair per line (readable diffs, a tenth of the lines)."""
    lines = ["{"]
    lines.append(f' "about": {json.dumps(found["about"], ensure_ascii=False)},')
    lines.append(f' "sources": {json.dumps(found["sources"], ensure_ascii=False)},')
    lines.append(' "pairs": {')
    packages = list(found["pairs"].items())
    for index, (name, parts) in enumerate(packages):
        lines.append(f"  {json.dumps(name)}: {{")
        kinds = list(parts.items())
        for kind_index, (kind, pairs) in enumerate(kinds):
            lines.append(f"   {json.dumps(kind)}: [")
            rows = [f"    {json.dumps(pair, ensure_ascii=False)}" for pair in pairs]
            lines.append(",\n".join(rows))
            lines.append("   ]" + ("," if kind_index < len(kinds) - 1 else ""))
        lines.append("  }" + ("," if index < len(packages) - 1 else ""))
    lines.append(" }")
    lines.append("}")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("wheels", nargs="+", type=Path)
    parser.add_argument("--output", type=Path, default=PAIRS)
    args = parser.parse_args(argv)
    found = extract_pairs(args.wheels)
    args.output.write_text(compact_json(found))
    for name, parts in found["pairs"].items():
        print(name, {part: len(pairs) for part, pairs in parts.items()})


if __name__ == "__main__":
    main()
