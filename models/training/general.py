"""General-language sources of corpus v3: dictionaries and translated documentation.

The gettext catalogs of :mod:`models.training.corpus` teach software strings only; an everyday
sentence comes out as nonsense. These sources add general language, still reached through
Debian's package registry alone (``apt-get download``, nothing installed):

* **dictionaries** (words, phrases, example sentences): Ding's German–English word list
  (``trans-de-en``, about 400k lines) and FreeDict ``eng-deu`` / ``deu-eng`` (dictd files);
* **prose**: documentation translated with itstool or po4a, where the German file has the
  English file's element structure, so blocks align one to one: the GNOME help pages
  (``/usr/share/help/{C,de}/<app>/*.page``), the Debian Administrator's Handbook, the Debian
  Reference and the Debian FAQ.

Every package is pinned by version and by the SHA-256 of its ``.deb`` (Debian's Packages index
lists both); a download whose hash differs fails loudly instead of changing the corpus.
Licences are read from each package's DEP-5 copyright file, as for the catalogs, with
overrides where that file is free-form.

Documentation whose translations live only in source packages (manpages-l10n, the
installation guide's po files, the release notes) is not used: the registry this machine
reaches serves the ``.dsc`` files but not their tarballs.
"""

from __future__ import annotations

import gzip
import hashlib
import random
import re
import subprocess
import sys
import tarfile
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path

from models.training.corpus import NO_MNEMONICS, Pair, clean_pair, debian_licence

DICTIONARY = "dictionary"
PROSE = "prose"
EXAMPLE = "example"
"""Whole sentences inside the dictionaries (Ding's "Das ist doch nicht möglich. :: That really
isn't possible."): everyday language, which no other source in the registry carries."""

PROSE_VALID_SIZE = 1000
PROSE_TEST_MIN_PAIRS = 1500
PROSE_HELD_OUT_MAX_PAIRS = 1000
"""Only packages with at most this many pairs are held out whole, so that no single large
document (the Debian Reference) leaves training."""
PROSE_SPLIT_SEED = 20261128
GENERAL_VALID_SIZE = 500
GENERAL_TEST_SIZE = 1500
"""``valid-general`` / ``test-general``: example sentences drawn out of every source, the yardstick
of everyday language (a model trained on catalogs alone scores low on it)."""
DEFAULT_DICT_RATIO = 0.25
"""Dictionary entries per sentence pair in ``train`` (catalog and prose pairs together). The
entries are words and phrases; too many would teach the model to answer in fragments."""


@dataclass(frozen=True)
class Deb:
    """A binary package pinned by version and by the SHA-256 of its ``.deb``."""

    package: str
    version: str
    sha256: str


@dataclass(frozen=True)
class DebSource:
    """One corpus source: a pinned package, what kind of text it holds, how to read it."""

    deb: Deb
    kind: str  # DICTIONARY or PROSE
    reader: str  # key of READERS
    licence: str = ""  # empty: read the package's copyright file
    companions: tuple[Deb, ...] = ()  # packages holding the English originals

    @property
    def package(self) -> str:
        return self.deb.package


# Pins from bookworm's Packages index (``apt-cache show --no-all-versions``); the licence of
# each is its copyright file's ``Files: *`` licence, as for the catalogs.
GNOME_HELP_DEBS: tuple[Deb, ...] = (
    Deb("gnome-user-docs", "43.0-2", "0d635a840747958ca84da778b40d341f1155603851f922c9a171f5a181d6a39f"),
    Deb("gnome-devel-docs", "40.3-1", "6089362d009f1c38b406fdf88da24d69965eaa5756097c50e0954bba5312bfbc"),
    Deb("evolution-common", "3.46.4-2+deb12u1", "52e3a67ba3f2815fa864f600f5e3c2afd6ebc0b3487b50525df75006d4172b46"),
    Deb("evince-common", "43.1-2+deb12u1", "777ea7d094db2acd7b385e272b0ba6cf03c7e45d574e6f2c689b507de3d95dbb"),
    Deb("gedit-common", "44.2-1", "3d9446b4ddcc7db0df41d9ee7f71b60a1d29ad688b6acbe04fe6fbea3461d5ef"),
    Deb("shotwell-common", "0.30.17-1", "2d40611f6fe255b5c079cfe44a1943dfbcd1c88b27acf472d53ed935f67fb904"),
    Deb("seahorse", "43.0-1", "9568f42e1587c556f90143fdc252b6dc99276684a4da140b07607efb583968d4"),
    Deb("eog", "43.2-1", "b6cea092ddbdd1ea586aea946f59ea562ed9e34f4067ecae7aebbfccca319a1b"),
    Deb("gnome-terminal-data", "3.46.8-1", "7702598bf2f81b6ec713d14867e367d9f5f2f91580c233db0dadc4c31c2f227d"),
    Deb("gnome-calculator", "1:43.0.1-2", "395526cc25086a0ad15cdcd6daf403e5eb542cfe494de743e2e9394c39a0f065"),
    Deb("gnome-system-monitor", "42.0-2", "fb6f0c54b9af1a17e1d047dccbe4a8df6b54fe2cde4cb6a214d78dabbee3ea68"),
    Deb("gnome-boxes", "43.2-1", "64597f81b5492fbdb18d97e53b45ad376d247d7a993f2daf41c6474c5cef62f5"),
    Deb("totem-common", "43.0-2", "23190cc8726d7b8bfe9a4362260cdb2c98d304b195104ffc7ea382593c991ad8"),
    Deb("cheese-common", "43.0-1", "851b3595fcb7b5dbba1c646bfddd64a56907302e0b85db4c38dda1aa2336bfbb"),
    Deb("file-roller", "43.0-1", "2bb8ba003a234b82228154ca5555c55e464b010d1d866605658d1cd510e52de2"),
    Deb("simple-scan", "42.5-2", "782842b780d6069fbc422122e40cd38de19c3577a8129e431744028b812ff2ef"),
    Deb("baobab", "43.0-1", "acab793673e0f559080b492a40281c5ea7da04da5830c28c346cca62860fad69"),
    Deb("gnome-clocks", "43.0-1", "cd92c912a6f69789785b9e898611a6f8ced7659597e000e8f7a92583cf259a46"),
    Deb("gnome-logs", "43.0-1", "6d64422e389bb6d0a0afc070d7db2c837a0e1269ce11d4f8fb3a7fa9806dc28d"),
)  # fmt: skip
SOURCES: tuple[DebSource, ...] = (
    DebSource(
        Deb("trans-de-en", "1.9-6",
            "45f6b4cf1c434776fba6811d7bc522efabb5425c43ba8afd0e289bf9e2e53df4"),
        DICTIONARY, "ding",
    ),
    DebSource(
        Deb("dict-freedict-eng-deu", "2022.04.21-1",
            "e85da1519a4d5efdbd7a5a169e828b97920f91e899f45d56fd5b2266a05b5906"),
        DICTIONARY, "freedict-eng-deu", "GPL-2+",
    ),
    DebSource(
        Deb("dict-freedict-deu-eng", "2022.04.21-1",
            "52fa2ba6c73ebe84df0e4a7b8612a94a45e6026a157fc75f5ae36c4a1106e3db"),
        DICTIONARY, "freedict-deu-eng", "GPL-2+",
    ),
    *(DebSource(deb, PROSE, "gnome-help") for deb in GNOME_HELP_DEBS),
    DebSource(
        Deb("debian-handbook", "11.20220922",
            "3d5dbeac1f1afc9c094eab9d0f701f6ecff99c4927d5a4794cf6c85678134faa"),
        PROSE, "handbook",
    ),
    DebSource(
        Deb("debian-reference-de", "2.100",
            "3b0ce65fd63e75ddf8eb07ca36293425135080e690a07e06a6ac8bc8040ef0aa"),
        PROSE, "suffix-html",
        companions=(Deb("debian-reference-en", "2.100",
                        "9f31d3a17df505de09689ca255512ea58c1fc47c59bb1b0c7bf1c23362e9743f"),),
    ),
    DebSource(
        Deb("debian-faq-de", "11.1",
            "e9a8d8234f4b182660d521f80f50cea87f797b4541005a3d64fab7777766f6de"),
        PROSE, "suffix-html",
        companions=(Deb("debian-faq", "11.1",
                        "427426e0cfa6888622fc1d72631071cb4b5a1f86ccde722e7820bcef284de5d0"),),
    ),
)  # fmt: skip


# --------------------------------------------------------------------------------------
# Dictionaries.
# --------------------------------------------------------------------------------------

_DING_ANNOTATION_RE = re.compile(r"\{[^}]*\}|\[[^\]]*\]|\([^)]*\)|<[^>]*>")
_FREEDICT_TAG_RE = re.compile(r"<[^>]*>")


def _plain(text: str) -> str:
    return " ".join(_DING_ANNOTATION_RE.sub(" ", text).split()).strip(" ;,")


def ding_pairs(line: str) -> list[tuple[str, str]]:
    """``(english, german)`` pairs of one Ding line ``German | phrase :: English | phrase``.

    ``|`` separates aligned sub-entries (the word, its plural, example phrases), ``;``
    alternatives; the first alternative of each side is kept. Annotations (``{f}``,
    ``[sport]``, ``(climbing)``, ``<Birke>``) are not translations and are removed.
    """
    if line.startswith("#") or " :: " not in line:
        return []
    german, _, english = line.partition(" :: ")
    german_parts, english_parts = german.split(" | "), english.split(" | ")
    if len(german_parts) != len(english_parts):
        return []
    pairs = []
    for german_part, english_part in zip(german_parts, english_parts, strict=True):
        german_text = _plain(german_part.split(";")[0])
        english_text = _plain(english_part.split(";")[0])
        if german_text and english_text:
            pairs.append((english_text, german_text))
    return pairs


def freedict_pairs(
    dict_text: str, index_text: str, headword_is_english: bool
) -> list[tuple[str, str]]:
    """``(english, german)`` pairs of a dictd dictionary: each headword with its first
    translation (the second line of the entry, grammar tags ``<fem>`` removed)."""
    pairs = []
    data = dict_text.encode("utf-8")
    for line in index_text.splitlines():
        fields = line.split("\t")
        if len(fields) != 3 or fields[0].startswith("00-database"):
            continue
        offset, length = _b64_number(fields[1]), _b64_number(fields[2])
        entry_lines = data[offset : offset + length].decode("utf-8", "replace").split("\n")
        if len(entry_lines) < 2:
            continue
        headword = fields[0].strip()
        translation = _FREEDICT_TAG_RE.sub("", entry_lines[1]).split(",")[0].strip()
        if headword and translation:
            pairs.append(
                (headword, translation) if headword_is_english else (translation, headword)
            )
    return pairs


_B64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"


def _b64_number(text: str) -> int:
    """dictd's index numbers: base 64, most significant digit first."""
    number = 0
    for char in text:
        number = number * 64 + _B64.index(char)
    return number


# --------------------------------------------------------------------------------------
# Prose: documents translated with itstool / po4a keep the original's element structure.
# --------------------------------------------------------------------------------------

BLOCK_TAGS = frozenset(
    {"p", "title", "desc", "h1", "h2", "h3", "h4", "h5", "h6", "li", "dt", "td", "th", "caption"}
)
SKIPPED_TAGS = frozenset(
    {
        "info",
        "pre",
        "code",
        "screen",
        "script",
        "style",
        "head",
        "cmd",
        "programlisting",
        "synopsis",
    }
)
_SENTENCE_END_RE = re.compile(r"(?<=[.!?])\s+(?=[\"„“(]?[A-ZÄÖÜ0-9])")


class _BlockCollector(HTMLParser):
    """Text of every block element in document order; text of a block that contains other
    blocks is cut where they start, the same way on both sides."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.blocks: list[str] = []
        self._open_blocks = 0
        self._skip_depth = 0
        self._text: list[str] = []

    def _flush(self) -> None:
        text = " ".join("".join(self._text).split())
        if text:
            self.blocks.append(text)
        self._text = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        name = tag.split(":")[-1]
        if name in SKIPPED_TAGS:
            self._skip_depth += 1
        elif name in BLOCK_TAGS and not self._skip_depth:
            self._flush()
            self._open_blocks += 1

    def handle_endtag(self, tag: str) -> None:
        name = tag.split(":")[-1]
        if name in SKIPPED_TAGS:
            self._skip_depth = max(0, self._skip_depth - 1)
        elif name in BLOCK_TAGS and not self._skip_depth and self._open_blocks:
            self._flush()
            self._open_blocks -= 1

    def handle_data(self, data: str) -> None:
        if self._open_blocks and not self._skip_depth:
            self._text.append(data)


def document_blocks(markup: str) -> list[str]:
    """The block texts of an XML (Mallard, DocBook) or HTML document."""
    collector = _BlockCollector()
    collector.feed(markup)
    collector.close()
    return collector.blocks


def split_sentences(text: str) -> list[str]:
    return [part for part in _SENTENCE_END_RE.split(text) if part.strip()]


def align_documents(english: str, german: str) -> list[tuple[str, str]] | None:
    """Aligned ``(english, german)`` segments of two renderings of one document, or ``None``
    when their block structures differ (nothing of the document is trusted then).

    Blocks pair one to one; a block pair whose sentence counts match is split into
    sentences, otherwise it stays whole (and the length filter decides)."""
    english_blocks, german_blocks = document_blocks(english), document_blocks(german)
    if len(english_blocks) != len(german_blocks):
        return None
    segments = []
    for english_block, german_block in zip(english_blocks, german_blocks, strict=True):
        english_sentences, german_sentences = (
            split_sentences(english_block),
            split_sentences(german_block),
        )
        if len(english_sentences) > 1 and len(english_sentences) == len(german_sentences):
            segments += list(zip(english_sentences, german_sentences, strict=True))
        else:
            segments.append((english_block, german_block))
    return segments


# --------------------------------------------------------------------------------------
# Fetching.
# --------------------------------------------------------------------------------------


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as stream:
        for chunk in iter(lambda: stream.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def fetch_deb(source: Deb, deb_dir: Path) -> Path:
    """The pinned ``.deb`` (downloaded once, hash checked every time)."""
    deb_dir.mkdir(parents=True, exist_ok=True)
    matches = sorted(deb_dir.glob(f"{source.package}_*.deb"))
    if not matches:
        subprocess.run(
            ["apt-get", "download", "-q", f"{source.package}={source.version}"],
            cwd=deb_dir, check=True, capture_output=True,
        )  # fmt: skip
        matches = sorted(deb_dir.glob(f"{source.package}_*.deb"))
    deb = matches[-1]
    if sha256_of(deb) != source.sha256:
        raise ValueError(f"{deb.name}: SHA-256 differs from the pin in general.py")
    return deb


def deb_members(deb: Path, wanted: Callable[[str], bool]) -> Iterator[tuple[str, bytes]]:
    """``(path, content)`` of the regular files of a ``.deb`` that ``wanted`` accepts."""
    stream = subprocess.Popen(["dpkg-deb", "--fsys-tarfile", str(deb)], stdout=subprocess.PIPE)
    assert stream.stdout is not None
    with tarfile.open(fileobj=stream.stdout, mode="r|") as tarred:
        for member in tarred:
            name = member.name.removeprefix("./")
            if member.isfile() and wanted(name):
                extracted = tarred.extractfile(member)
                if extracted is not None:
                    yield name, extracted.read()
    stream.wait()


# --------------------------------------------------------------------------------------
# Readers: one .deb's files -> raw (english, german) pairs.
# --------------------------------------------------------------------------------------


def read_ding(files: dict[str, bytes]) -> Iterator[tuple[str, str]]:
    for line in files["usr/share/trans/de-en"].decode("utf-8", "replace").splitlines():
        yield from ding_pairs(line)


def _read_freedict(
    files: dict[str, bytes], name: str, english_first: bool
) -> list[tuple[str, str]]:
    dict_text = gzip.decompress(files[f"usr/share/dictd/{name}.dict.dz"]).decode("utf-8", "replace")
    index_text = files[f"usr/share/dictd/{name}.index"].decode("utf-8", "replace")
    return freedict_pairs(dict_text, index_text, english_first)


def read_aligned_documents(
    files: dict[str, bytes], english_path_of: Callable[[str], str | None], drops: Counter[str]
) -> Iterator[tuple[str, str]]:
    """Every German document with an English original in the same package, aligned."""
    for path, content in sorted(files.items()):
        english_path = english_path_of(path)
        if english_path is None or english_path not in files:
            continue
        segments = align_documents(
            files[english_path].decode("utf-8", "replace"), content.decode("utf-8", "replace")
        )
        if segments is None:
            drops["prose_document_misaligned"] += 1
            continue
        yield from segments


def gnome_help_english(path: str) -> str | None:
    match = re.fullmatch(r"usr/share/help/de/(.+\.page)", path)
    return f"usr/share/help/C/{match.group(1)}" if match else None


def suffix_english(path: str) -> str | None:
    """``x.de.html`` -> ``x.en.html`` (Debian Reference, Debian FAQ; the FAQ keeps German
    pages in ``FAQ/de/``)."""
    match = re.fullmatch(r"(.+?)(?:/de)?/([^/]+)\.de\.html", path)
    return f"{match.group(1)}/{match.group(2)}.en.html" if match else None


def handbook_english(path: str) -> str | None:
    match = re.fullmatch(r"(usr/share/doc/debian-handbook/html)/de-DE/([^/]+\.html)", path)
    return f"{match.group(1)}/en-US/{match.group(2)}" if match else None


def _wants_document(path: str) -> bool:
    return path.endswith((".page", ".html")) and (
        "/help/de/" in path or "/help/C/" in path or ".de.html" in path or ".en.html" in path
        or "/de-DE/" in path or "/en-US/" in path
    )  # fmt: skip


READERS: dict[str, Callable[[dict[str, bytes], Counter[str]], Iterable[tuple[str, str]]]] = {
    "ding": lambda files, _: read_ding(files),
    "freedict-eng-deu": lambda files, _: _read_freedict(files, "freedict-eng-deu", True),
    "freedict-deu-eng": lambda files, _: _read_freedict(files, "freedict-deu-eng", False),
    "gnome-help": lambda files, drops: read_aligned_documents(files, gnome_help_english, drops),
    "suffix-html": lambda files, drops: read_aligned_documents(files, suffix_english, drops),
    "handbook": lambda files, drops: read_aligned_documents(files, handbook_english, drops),
}


def _wants(reader: str) -> Callable[[str], bool]:
    if reader == "ding":
        return lambda path: path == "usr/share/trans/de-en"
    if reader.startswith("freedict"):
        return lambda path: path.startswith("usr/share/dictd/")
    return _wants_document


# --------------------------------------------------------------------------------------
# Collecting and splitting.
# --------------------------------------------------------------------------------------


def source_pairs(
    source: DebSource, deb: Path, companions: list[Path], drops: Counter[str]
) -> list[Pair]:
    """Clean pairs of one source (``companions``: further ``.deb`` files whose documents
    complete it, such as ``debian-reference-en`` beside ``debian-reference-de``)."""
    wanted = _wants(source.reader)
    files: dict[str, bytes] = {}
    copyright_text = b""
    for archive in [deb, *companions]:
        for name, content in deb_members(
            archive, lambda path: wanted(path) or path.endswith(f"doc/{source.package}/copyright")
        ):
            if name.endswith("/copyright"):
                copyright_text = content
            else:
                files[name] = content
    licence = source.licence or _licence_from(copyright_text, source.package)
    package = f"debian:{source.package}"
    pairs = []
    for english, german in READERS[source.reader](files, drops):
        cleaned = clean_pair(english, german, NO_MNEMONICS, drops)
        if cleaned:
            pairs.append(Pair(cleaned[0], cleaned[1], package, licence))
    return pairs


def _licence_from(copyright_text: bytes, package: str) -> str:
    if not copyright_text:
        return "unknown"
    import tempfile

    with tempfile.TemporaryDirectory() as doc_root:
        (Path(doc_root) / package).mkdir()
        (Path(doc_root) / package / "copyright").write_bytes(copyright_text)
        return debian_licence(package, Path(doc_root))


def split_prose(
    pairs: list[Pair],
    valid_size: int = PROSE_VALID_SIZE,
    test_min_pairs: int = PROSE_TEST_MIN_PAIRS,
    seed: int = PROSE_SPLIT_SEED,
    max_package_pairs: int = PROSE_HELD_OUT_MAX_PAIRS,
) -> tuple[dict[str, list[Pair]], list[str]]:
    """``test-prose``: whole packages of at most ``max_package_pairs`` pairs, drawn by ``seed``
    until it holds ``test_min_pairs`` (documentation a model has never seen a page of);
    ``valid-prose``:
    random pairs of the remaining packages; ``train-prose``: the rest. Returns the splits and
    the held-out packages."""
    rng = random.Random(seed)
    sizes = Counter(pair.package for pair in pairs)
    packages = sorted(package for package, size in sizes.items() if size <= max_package_pairs)
    rng.shuffle(packages)
    held_out: list[str] = []
    held_pairs = 0
    for package in packages:
        if held_pairs >= test_min_pairs or len(held_out) == len(packages) - 1:
            break
        held_out.append(package)
        held_pairs += sizes[package]
    test = [pair for pair in pairs if pair.package in held_out]
    rest = [pair for pair in pairs if pair.package not in held_out]
    order = list(range(len(rest)))
    rng.shuffle(order)
    valid_indices = set(order[:valid_size])
    valid = [pair for index, pair in enumerate(rest) if index in valid_indices]
    train = [pair for index, pair in enumerate(rest) if index not in valid_indices]
    return {"train-prose": train, "valid-prose": valid, "test-prose": test}, sorted(held_out)


_FINAL_STOP_RE = re.compile(r"[.?!][\"'“”‘’»«]?$")
_PHRASE_MARKERS_RE = re.compile(r"\b(?:jd[mnrs]?|etw|sb|sth|o\.s)\.|\.\.\.|…|/")
EXAMPLE_MIN_WORDS = 4


def is_example_sentence(english: str, german: str) -> bool:
    """Whether a dictionary entry is a whole sentence on both sides: a capital first letter, a
    final ``.``, ``?`` or ``!``, at least :data:`EXAMPLE_MIN_WORDS` words, and none of the
    placeholders of a phrase entry (``jdm.``, ``etw.``, ``sb.``, ``sth.``, ``...``, ``a/b``)."""
    for text in (english, german):
        if len(text.split()) < EXAMPLE_MIN_WORDS or not text[0].isupper():
            return False
        if not _FINAL_STOP_RE.search(text) or _PHRASE_MARKERS_RE.search(text):
            return False
    return True


def split_examples(
    examples: list[Pair],
    valid_size: int = GENERAL_VALID_SIZE,
    test_size: int = GENERAL_TEST_SIZE,
    seed: int = PROSE_SPLIT_SEED,
) -> dict[str, list[Pair]]:
    """``valid-general`` and ``test-general``: example sentences drawn by ``seed``;
    ``train-examples``: the rest, which train in full (they are sentences, not the words and
    phrases that :func:`mix_dictionary` dilutes)."""
    order = list(range(len(examples)))
    random.Random(seed).shuffle(order)
    valid = [examples[i] for i in sorted(order[:valid_size])]
    test = [examples[i] for i in sorted(order[valid_size : valid_size + test_size])]
    train = [examples[i] for i in sorted(order[valid_size + test_size :])]
    return {"train-examples": train, "valid-general": valid, "test-general": test}


def mix_dictionary(
    sentence_pairs: int, dictionary: list[Pair], ratio: float, seed: int = PROSE_SPLIT_SEED
) -> list[Pair]:
    """At most ``ratio`` x ``sentence_pairs`` dictionary entries, drawn by ``seed``."""
    wanted = min(len(dictionary), round(ratio * sentence_pairs))
    return (
        random.Random(seed).sample(dictionary, wanted) if wanted < len(dictionary) else dictionary
    )


def collect_general(
    deb_dir: Path, drops: Counter[str], sources: Iterable[DebSource] = SOURCES
) -> tuple[dict[str, list[Pair]], dict[str, str]]:
    """Clean pairs per kind (``{DICTIONARY: [...], PROSE: [...]}``), in a fixed order, and the
    packages that could not be fetched (with why)."""
    pairs: dict[str, list[Pair]] = {DICTIONARY: [], PROSE: []}
    not_fetched: dict[str, str] = {}
    for source in sources:
        try:
            deb = fetch_deb(source.deb, deb_dir)
            companions = [fetch_deb(companion, deb_dir) for companion in source.companions]
        except (subprocess.CalledProcessError, ValueError) as error:
            not_fetched[f"debian:{source.package}"] = str(error)
            continue
        found = source_pairs(source, deb, companions, drops)
        pairs[source.kind] += found
        print(f"debian:{source.package} ({source.kind}): {len(found)} pairs", file=sys.stderr)
    return pairs, not_fetched
