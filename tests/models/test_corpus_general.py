"""Corpus v3's general-language sources: dictionary parsing, document alignment, splits."""

from models.training.build_corpus import without_leaks
from models.training.corpus import Pair
from models.training.general import (
    _B64,
    align_documents,
    ding_pairs,
    freedict_pairs,
    is_example_sentence,
    mix_dictionary,
    split_examples,
    split_prose,
)


def test_ding_line_gives_aligned_sub_entries_without_annotations() -> None:
    line = (
        "Abseitsregel {f} [sport] | Abseitsregeln {pl} | im Abseits stehen; abseits sein "
        ":: offside rule | offside rules | to be offside (football)"
    )
    assert ding_pairs(line) == [
        ("offside rule", "Abseitsregel"),
        ("offside rules", "Abseitsregeln"),
        ("to be offside", "im Abseits stehen"),
    ]
    assert ding_pairs("# Version :: devel") == []
    assert ding_pairs("Katze | Katzen :: cat") == []  # sub-entries that do not align


def _b64(number: int) -> str:
    digits = ""
    while True:
        digits = _B64[number % 64] + digits
        number //= 64
        if not number:
            return digits


def test_freedict_headword_pairs_with_its_first_translation() -> None:
    entries = ["cat /kat/\nKatze <fem>, Kater <masc>\n", "dog\nHund <masc>\n"]
    text = "".join(entries)
    index, offset = [], 0
    for entry in entries:
        length = len(entry.encode())
        index.append(f"{entry.split()[0]}\t{_b64(offset)}\t{_b64(length)}")
        offset += length
    index.insert(0, "00-database-info\tA\tB")
    assert freedict_pairs(text, "\n".join(index), headword_is_english=True) == [
        ("cat", "Katze"),
        ("dog", "Hund"),
    ]
    assert freedict_pairs(text, "\n".join(index), headword_is_english=False)[1] == (
        "Hund",
        "dog",
    )


ENGLISH_PAGE = """<page><info><credit><name>Ann</name></credit></info>
<title>Create a file</title>
<p>Click <gui>New</gui>. The file opens in a new tab.</p>
<screen>gedit file.txt</screen>
<p>Save it when you are done.</p></page>"""
GERMAN_PAGE = """<page><info><credit><name>Ann</name></credit>
<credit type="translator"><name>Bea</name></credit></info>
<title>Eine Datei anlegen</title>
<p>Klicken Sie auf <gui>Neu</gui>. Die Datei öffnet sich in einem neuen Reiter.</p>
<screen>gedit datei.txt</screen>
<p>Speichern Sie sie, wenn Sie fertig sind.</p></page>"""


def test_translated_document_aligns_block_by_block_and_sentence_by_sentence() -> None:
    assert align_documents(ENGLISH_PAGE, GERMAN_PAGE) == [
        ("Create a file", "Eine Datei anlegen"),
        ("Click New.", "Klicken Sie auf Neu."),
        ("The file opens in a new tab.", "Die Datei öffnet sich in einem neuen Reiter."),
        ("Save it when you are done.", "Speichern Sie sie, wenn Sie fertig sind."),
    ]
    shorter = GERMAN_PAGE.replace("<p>Speichern Sie sie, wenn Sie fertig sind.</p>", "")
    assert align_documents(ENGLISH_PAGE, shorter) is None  # structure differs: nothing trusted


def _pair(source: str, package: str) -> Pair:
    return Pair(source, source.upper(), package, "GPL-2+")


def test_prose_test_split_holds_out_whole_packages() -> None:
    pairs = [_pair(f"{package} sentence {i}", package) for package in "abcdef" for i in range(50)]
    pairs += [_pair(f"manual sentence {i}", "g") for i in range(300)]
    splits, held_out = split_prose(
        pairs, valid_size=20, test_min_pairs=100, seed=3, max_package_pairs=60
    )
    assert len(held_out) == 2 and "g" not in held_out  # too large to leave training whole
    assert {pair.package for pair in splits["test-prose"]} == set(held_out)
    assert not {pair.package for pair in splits["train-prose"]} & set(held_out)
    assert len(splits["valid-prose"]) == 20
    assert sum(map(len, splits.values())) == len(pairs)
    assert split_prose(pairs, 20, 100, 3, 60)[1] == held_out


def test_training_pairs_that_share_a_side_with_evaluation_are_dropped() -> None:
    evaluation = [Pair("Open the door.", "Öffne die Tür.", "debian:x", "GPL")]
    train = [
        Pair("Open the door.", "Mach die Tür auf.", "debian:y", "GPL"),
        Pair("Door", "Öffne die Tür.", "debian:y", "GPL"),
        Pair("Window", "Fenster", "debian:y", "GPL"),
    ]
    assert without_leaks(train, evaluation) == [train[2]]


def test_training_pairs_that_differ_from_evaluation_in_case_or_punctuation_are_dropped() -> None:
    evaluation = [Pair("It's raining.", "Es regnet.", "debian:x", "GPL")]
    train = [
        Pair("it's raining!", "Es regnet gerade.", "debian:y", "GPL"),
        Pair("The rain.", "Es regnet", "debian:y", "GPL"),
        Pair("It is raining.", "Der Regen.", "debian:y", "GPL"),
        Pair("...", "…", "debian:y", "GPL"),
    ]
    assert without_leaks(train, evaluation) == train[2:]


def test_example_sentences_are_whole_sentences_on_both_sides() -> None:
    assert is_example_sentence("That really isn't possible.", "Das ist doch nicht möglich.")
    assert is_example_sentence("Can you tell me the way?", "Können Sie mir den Weg sagen?")
    assert is_example_sentence("He said “stop it now!”", "Er sagte „Hör jetzt auf!“")
    assert not is_example_sentence("to be offside", "im Abseits stehen")  # a phrase
    assert not is_example_sentence("Stop it.", "Hör sofort damit auf.")  # too short a side
    assert not is_example_sentence("He gave sb. a hand.", "Er hat jdm. geholfen.")
    assert not is_example_sentence("It is worth ... dollars.", "Es ist ... Dollar wert.")
    assert not is_example_sentence("It is a cheque/check for you.", "Es ist ein Scheck für dich.")
    assert not is_example_sentence("the cat sleeps on the sofa.", "Die Katze schläft auf dem Sofa.")


def test_example_sentences_split_into_fixed_disjoint_evaluation_sets() -> None:
    examples = [_pair(f"Sentence number {i} is here.", "debian:trans-de-en") for i in range(50)]
    splits = split_examples(examples, valid_size=5, test_size=10, seed=3)
    assert [len(splits[name]) for name in ("valid-general", "test-general", "train-examples")] == [
        5, 10, 35,
    ]  # fmt: skip
    assert sorted(pair.source for split in splits.values() for pair in split) == sorted(
        pair.source for pair in examples
    )
    assert split_examples(examples, 5, 10, 3) == splits
    assert split_examples(examples, 5, 10, 4)["test-general"] != splits["test-general"]


def test_dictionary_entries_are_mixed_at_the_ratio() -> None:
    dictionary = [_pair(f"word {i}", "debian:trans-de-en") for i in range(100)]
    assert len(mix_dictionary(40, dictionary, 0.5)) == 20
    assert mix_dictionary(40, dictionary, 0.5) == mix_dictionary(40, dictionary, 0.5)
    assert len(mix_dictionary(400, dictionary, 0.5)) == 100
