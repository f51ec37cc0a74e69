"""Catalog cleaning for the training corpus, on small in-memory catalogs."""

import polib
import pytest

from models.training.corpus import (
    GTK_QT_MNEMONICS,
    LIBREOFFICE_MNEMONICS,
    MAX_TEXT_CHARS,
    Pair,
    align_paragraphs,
    catalog_pairs,
    debian_licence,
    deduplicate,
    entry_text_pairs,
    has_plausible_length,
    is_target_catalog,
    is_untranslated_copy,
    normalise_whitespace,
    packages_by_source,
    parse_catalog,
    prefer_po_over_mo,
    read_tsv,
    split_corpus,
    strip_mnemonics,
    unpacked_licence,
    write_plain_text,
    write_tsv,
)

PO_TEXT = r"""
msgid ""
msgstr ""
"Content-Type: text/plain; charset=UTF-8\n"
"Plural-Forms: nplurals=2; plural=(n != 1);\n"

msgid "_Open File"
msgstr "Datei _öffnen"

#, fuzzy
msgid "Close"
msgstr "Schließen"

msgid "Untranslated"
msgstr ""

msgid "%(count)d file"
msgid_plural "%(count)d files"
msgstr[0] "%(count)d Datei"
msgstr[1] "%(count)d Dateien"

#. Default: "Log in to ${site}"
msgid "label_login"
msgstr "Bei ${site} anmelden"

msgid "label_no_default"
msgstr "Etwas"

msgid "This sentence was copied"
msgstr "This sentence was copied"

msgid "Name"
msgstr "Name"

#~ msgid "Obsolete thing"
#~ msgstr "Veraltetes Ding"

msgid "A wrapped\n"
"line"
msgstr "Eine umbrochene\n"
"Zeile"
"""


@pytest.fixture
def catalog() -> polib.POFile:
    return polib.pofile(PO_TEXT)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("_File", "File"),
        ("E_xit", "Exit"),
        ("Save _As…", "Save As…"),
        ("&Open", "Open"),
        ("Sa&ve", "Save"),
        ("Tom &amp; Jerry", "Tom &amp; Jerry"),
        ("cd src && make", "cd src && make"),
        ("R&D", "R&D"),
        ("user_name is taken", "user_name is taken"),
        ("Hello %(user_name)s", "Hello %(user_name)s"),
        ("_New and _Old", "_New and _Old"),  # two candidates: not a mnemonic
        ("plain text", "plain text"),
    ],
)
def test_strip_mnemonics_gtk_and_qt(text: str, expected: str) -> None:
    assert strip_mnemonics(text, GTK_QT_MNEMONICS) == expected


def test_strip_mnemonics_libreoffice_tilde() -> None:
    assert strip_mnemonics("~Insert Rows", LIBREOFFICE_MNEMONICS) == "Insert Rows"
    assert strip_mnemonics("Sa~ve", LIBREOFFICE_MNEMONICS) == "Save"
    assert strip_mnemonics("open ~/config", LIBREOFFICE_MNEMONICS) == "open ~/config"


def test_fuzzy_empty_and_obsolete_entries_give_no_pairs(catalog: polib.POFile) -> None:
    sources = {source for entry in catalog for source, _ in entry_text_pairs(entry)}
    assert "Close" not in sources
    assert "Untranslated" not in sources
    assert "Obsolete thing" not in sources


def test_plural_entry_gives_singular_and_plural_pairs(catalog: polib.POFile) -> None:
    plural_entry = catalog.find("%(count)d file")
    assert entry_text_pairs(plural_entry) == [
        ("%(count)d file", "%(count)d Datei"),
        ("%(count)d files", "%(count)d Dateien"),
    ]


def test_default_comment_replaces_symbolic_msgid(catalog: polib.POFile) -> None:
    assert entry_text_pairs(catalog.find("label_login")) == [
        ("Log in to ${site}", "Bei ${site} anmelden")
    ]
    assert entry_text_pairs(catalog.find("label_no_default")) == []


def test_catalog_pairs_cleans_the_whole_catalog(catalog: polib.POFile) -> None:
    pairs = catalog_pairs(catalog, "pypi:demo", "MIT", GTK_QT_MNEMONICS)
    assert [(p.source, p.target) for p in pairs] == [
        ("Open File", "Datei öffnen"),
        ("%(count)d file", "%(count)d Datei"),
        ("%(count)d files", "%(count)d Dateien"),
        ("Log in to ${site}", "Bei ${site} anmelden"),
        ("Name", "Name"),  # short identical terms are real German
        ("A wrapped line", "Eine umbrochene Zeile"),
    ]
    assert {(p.package, p.licence) for p in pairs} == {("pypi:demo", "MIT")}


def test_mo_bytes_parse_like_po(catalog: polib.POFile, tmp_path) -> None:
    mo_path = tmp_path / "demo.mo"
    catalog.save_as_mofile(str(mo_path))
    parsed = parse_catalog("demo.mo", mo_path.read_bytes())
    pairs = catalog_pairs(parsed, "debian:demo", "GPL-2", GTK_QT_MNEMONICS)
    assert ("Open File", "Datei öffnen") in [(p.source, p.target) for p in pairs]
    assert "Close" not in [p.source for p in pairs]  # msgfmt leaves fuzzy entries out


def test_untranslated_copies_and_lengths() -> None:
    assert is_untranslated_copy("Delete all files now", "Delete all files now")
    assert not is_untranslated_copy("Status", "Status")
    assert has_plausible_length("OK", "In Ordnung")
    assert not has_plausible_length("File", "Eine sehr lange Übersetzung für ein einziges Wort")
    assert not has_plausible_length("x" * (MAX_TEXT_CHARS + 1), "y" * (MAX_TEXT_CHARS + 1))


def test_whitespace_is_normalised() -> None:
    assert normalise_whitespace("  a\tb\n\nc\u00a0d  ") == "a b c d"


def test_paragraphs_align_one_to_one_only_when_counts_match() -> None:
    assert align_paragraphs("One.\n\nTwo.", "Eins.\n\nZwei.") == [
        ("One.", "Eins."),
        ("Two.", "Zwei."),
    ]
    assert align_paragraphs("One.\n\nTwo.", "Eins. Zwei.") == [("One.\n\nTwo.", "Eins. Zwei.")]


def test_deduplicate_keeps_the_most_frequent_target() -> None:
    pairs = [
        Pair("Open", "Öffnen", "a", "MIT"),
        Pair("Open", "Offen", "b", "MIT"),
        Pair("Open", "Offen", "c", "GPL"),
        Pair("Close", "Schließen", "a", "MIT"),
    ]
    assert deduplicate(pairs) == [
        Pair("Open", "Offen", "b", "MIT"),
        Pair("Close", "Schließen", "a", "MIT"),
    ]


def _package_corpus() -> list[Pair]:
    """Ten packages of 30 own strings each, plus strings every package shares ("Cancel")."""
    pairs = [
        Pair(f"{package} text {i}", f"{package} Text {i}", package, "MIT")
        for package in (f"debian:app{n}" for n in range(10))
        for i in range(30)
    ]
    pairs += [Pair("Cancel", "Abbrechen", f"debian:app{n}", "MIT") for n in range(10)]
    pairs += [
        Pair("Quit", "Beenden", "debian:app3", "MIT"),
        Pair("Quit", "Beenden", "pypi:x", "MIT"),
    ]
    return pairs


def test_splits_share_no_source_and_are_deterministic() -> None:
    raw = _package_corpus()
    unique = deduplicate(raw)
    splits, held_out = split_corpus(
        unique, packages_by_source(raw), valid_size=10, test_size=20,
        unseen_min_pairs=50, unseen_package_pairs=(10, 40), seed=1,
    )  # fmt: skip
    sources = {name: {p.source for p in split} for name, split in splits.items()}
    assert len(sources["valid"]) == 10 and len(sources["test"]) == 20
    for first in sources:
        for second in sources:
            if first != second:
                assert not sources[first] & sources[second], (first, second)
    assert sum(map(len, splits.values())) == len(unique)
    again = split_corpus(
        unique, packages_by_source(raw), valid_size=10, test_size=20,
        unseen_min_pairs=50, unseen_package_pairs=(10, 40), seed=1,
    )  # fmt: skip
    assert again == (splits, held_out)


def test_unseen_split_holds_whole_packages_strings_of_their_own() -> None:
    raw = _package_corpus()
    unique = deduplicate(raw)
    splits, held_out = split_corpus(
        unique, packages_by_source(raw), valid_size=5, test_size=5,
        unseen_min_pairs=50, unseen_package_pairs=(10, 40), seed=3,
    )  # fmt: skip
    assert len(held_out) == 2  # 30 own strings each: two packages reach 50
    unseen = splits["test-unseen"]
    assert {pair.package for pair in unseen} == set(held_out)
    own = [p.source for p in unique if p.package in held_out and " text " in p.source]
    assert sorted(p.source for p in unseen) == sorted(own)  # every own string, nothing shared
    training_sources = {p.source for p in splits["train"]}
    assert "Cancel" in training_sources | {p.source for p in splits["valid"] + splits["test"]}
    assert not training_sources & {p.source for p in unseen}


def test_train_drops_pairs_whose_target_is_an_evaluation_segment() -> None:
    # Two English sources with one German translation: if one is evaluated, the other must
    # not teach the German→English model that German sentence.
    raw = [Pair(f"s{i}", f"t{i}", "p", "MIT") for i in range(40)]
    raw += [Pair(f"s{i} again", f"t{i}", "p", "MIT") for i in range(40)]
    splits, _ = split_corpus(
        deduplicate(raw), packages_by_source(raw), valid_size=5, test_size=5,
        unseen_min_pairs=0, seed=2,
    )  # fmt: skip
    evaluation_targets = {p.target for name in ("valid", "test") for p in splits[name]}
    assert evaluation_targets  # the check below is about something
    assert not {p.target for p in splits["train"]} & evaluation_targets
    assert len(splits["train"]) < 80 - 10


def test_plain_text_files_are_line_aligned(tmp_path) -> None:
    pairs = [Pair("Open", "Öffnen", "p", "MIT"), Pair("Save as…", "Speichern unter …", "p", "MIT")]
    write_plain_text(pairs, tmp_path, "test-unseen", "de")
    assert (tmp_path / "test-unseen.en").read_text().splitlines() == ["Open", "Save as…"]
    assert (tmp_path / "test-unseen.de").read_text().splitlines() == ["Öffnen", "Speichern unter …"]


def test_unpacked_licence_follows_a_documentation_symlink(tmp_path) -> None:
    owner_doc = tmp_path / "app" / "usr/share/doc/app"
    owner_doc.mkdir(parents=True)
    (owner_doc / "copyright").write_text("Format: x\n\nFiles: *\nLicense: GPL-2+\n")
    (tmp_path / "app-data").mkdir()
    (tmp_path / "app-data" / "doc-link").write_text("app\n")
    assert unpacked_licence("app", tmp_path) == "GPL-2+"
    assert unpacked_licence("app-data", tmp_path) == "GPL-2+"


def test_tsv_round_trip_and_rejects_raw_newlines(tmp_path) -> None:
    pairs = [Pair('Say "hi"', "Sag „hallo“", "pypi:x", "MIT")]
    write_tsv(pairs, tmp_path / "t.tsv")
    assert read_tsv(tmp_path / "t.tsv") == pairs
    with pytest.raises(ValueError):
        write_tsv([Pair("a\nb", "c", "p", "l")], tmp_path / "bad.tsv")


def test_catalog_selection_in_archives() -> None:
    assert is_target_catalog("pkg/locale/de/LC_MESSAGES/django.po", "de")
    assert is_target_catalog("pkg/translations/de_DE/LC_MESSAGES/messages.mo", "de")
    assert not is_target_catalog("pkg/locale/de_Informal/LC_MESSAGES/django.po", "de")
    assert not is_target_catalog("pkg/locale/fr/LC_MESSAGES/django.po", "de")
    assert prefer_po_over_mo(["a/django.mo", "a/django.po", "a/hg.mo"]) == [
        "a/django.po",
        "a/hg.mo",
    ]


def test_debian_licence_reads_the_files_star_stanza(tmp_path) -> None:
    (tmp_path / "demo").mkdir()
    (tmp_path / "demo" / "copyright").write_text(
        "Format: https://example.org/dep5\n\nFiles: debian/*\nLicense: MIT\n\n"
        "Files: *\nCopyright: someone\nLicense: GPL-3+\n text of licence\n"
    )
    (tmp_path / "freeform").mkdir()
    (tmp_path / "freeform" / "copyright").write_text("This is free software.\nLicense: see below\n")
    assert debian_licence("demo", tmp_path) == "GPL-3+"
    assert debian_licence("freeform", tmp_path) == "unknown"
    assert debian_licence("missing", tmp_path) == "unknown"
