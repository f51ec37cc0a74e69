"""Which language a text is in, among the languages the service translates from.

Two models, each restricted to the served source languages (a detector that may answer
"Catalan" when only en/de/fr are served is no use for routing, and restricting the classes
makes short texts far less ambiguous), their log-probabilities added:

* py3langid (a maintained fork of langid.py: naive Bayes over byte n-grams, 142 languages,
  numpy only, offline) reads how the text is spelled;
* a unigram model of words (wordfreq's frequency lists, shipped in its wheel, offline, read by
  service/translation/word_lists.py) reads
  which words it uses. Short interface strings are mostly words: "Toggle Sort Order" has
  n-grams that py3langid finds as German as English, but each of its words is hundreds of
  times more frequent in English. The lists are cut to words of at least ``MIN_FREQUENCY``
  (tens of thousands of words a language, held as tables of word hashes: about 1 MiB each,
  service/translation/word_table.py) and unknown words count as that
  frequency in every language, so they weigh nothing, unless they split into two listed
  words of the language (``word_score``: German writes "Produktinformation" as one word).

Placeholders (``%(count)s``, ``{name}``, markup, URLs) are left out first: they are code, and
``count`` in ``%(count)s Elemente`` is not an English word of the text. Where a served
language has no word list, or wordfreq is not installed, py3langid decides alone. The
accuracy on held-out interface strings and long texts is in BENCHMARKS.md (bench/detection.py).

Confidences are the combined probabilities normalised over the served languages, 0–100 as
LibreTranslate reports them.

Restricting the classes has a cost: a French sentence sent to an en/de service would come out
"English, 99.9 %" and be translated as the nearest served language. So the text is first read
by py3langid over every language it knows; when the languages the service does not translate
from hold at least ``UNSERVED_CONFIDENCE`` of the probability, the likeliest of them is the
answer (and the request is refused naming it). Short interface strings of served languages
stay below that share (py3langid is unsure of them, not sure of another language), while a
sentence of another language passes it easily; the test over the held-out strings holds that.
A short string of another language rarely does ("Bonjour, comment allez-vous?" is not sure
enough of any one language for py3langid), so the words are read a second way: over the
served languages and every unserved one of their scripts that wordfreq lists, each with its
common words only (``UNSERVED_MIN_FREQUENCY``), n-grams and words combined as among the served
languages. When the unserved languages hold ``UNSERVED_WORDS_CONFIDENCE`` of that, the
likeliest of them is the answer ("vous", "allez" and "bonjour" are common French words and
rare English ones). Measured on short held-out strings of eight unserved languages and the
held-out en/de strings in bench/detection.py.
Letters of scripts that no served language writes are left out of that reading: a name in
another script (``Send the file to Дмитрий Иванов``, ``東京``) comes back verbatim inside a
translation, so it must not turn the text into a language nobody serves.

py3langid reads the text once, over every language: the restricted probabilities are a softmax
over the served languages' share of the same log scores, which is what restricting py3langid's
classes computes (the test against py3langid's own restricted reading holds that).

Detection reads at most ``SAMPLE_CHARS`` characters of the text, as detectors do: a sample
says which language a text is in, and the cost of a request then does not grow with it.

A batch of texts passed together gets one detection (LibreTranslate detects once per request,
since one model translates the whole request): the texts are scored together. ``/v1`` calls
:meth:`LanguageDetector.detect` once per text instead (service/translation/dispatch.py).

The base model (about 1.5 s to load) is read once per process and shared; each set of
languages gets its own restricted copy of the class tables. Classification only reads them,
so one detector serves every thread.
"""

from __future__ import annotations

import logging
import math
import unicodedata
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from service.text.placeholders import PLACEHOLDER_RE
from service.translation.word_lists import (
    COMPOUND_LINKS,
    UNSERVED_MIN_FREQUENCY,
    TextWords,
    common_word_log_frequencies,
    has_word_list,
    word_log_frequencies,
    words_of,
)
from service.translation.word_table import WordTable, WordTables

logger = logging.getLogger(__name__)

# Detected languages reported per text (LibreTranslate's /detect gives its top candidates).
TOP_CANDIDATES = 3
# The weight of py3langid's log-probability against the words' (chosen on the pretalx half
# of the held-out strings, bench/detection.py): the words decide when they disagree clearly,
# the n-grams when the words are unknown or shared.
NGRAM_WEIGHT = 1.5
# The share of the probability, over every language py3langid knows, at which the languages the
# service does not translate from win over the restricted detection (the module's docstring).
UNSERVED_CONFIDENCE = 0.999
# The characters detection reads: the start of the text, cut at a space where there is one.
SAMPLE_CHARS = 2048
# The share of the probability of the n-grams and words, over the served and those unserved
# languages, at which an unserved language is the answer (the module's docstring). Chosen on
# the short pretalx strings of bench/heldout and the first half of each language's unserved
# strings there: the lowest of 0.99, 0.995, 0.998 and 0.999 at which no served string leaves
# en/de (0.998 lets one German string go; django-oscar's and the second halves only measured).
UNSERVED_WORDS_CONFIDENCE = 0.999


# The scripts a language writes, as the first word of unicodedata's character names; languages
# not listed write Latin.
SCRIPTS: Mapping[str, frozenset[str]] = {
    **dict.fromkeys(
        ("ru", "uk", "bg", "sr", "mk", "be", "kk", "ky", "tg", "mn"), frozenset({"CYRILLIC"})
    ),
    **dict.fromkeys(("ar", "fa", "ur", "ps"), frozenset({"ARABIC"})),
    **dict.fromkeys(("hi", "mr", "ne"), frozenset({"DEVANAGARI"})),
    **dict.fromkeys(("he", "yi"), frozenset({"HEBREW"})),
    "el": frozenset({"GREEK"}),
    "zh": frozenset({"CJK"}),
    "ja": frozenset({"CJK", "HIRAGANA", "KATAKANA"}),
    "ko": frozenset({"HANGUL"}),
    "th": frozenset({"THAI"}),
    "ka": frozenset({"GEORGIAN"}),
    "hy": frozenset({"ARMENIAN"}),
    "bn": frozenset({"BENGALI"}),
    "ta": frozenset({"TAMIL"}),
}
_LATIN = frozenset({"LATIN"})


@lru_cache(maxsize=4096)
def script_of(char: str) -> str:
    return unicodedata.name(char, "UNKNOWN").split(" ", 1)[0]


def in_scripts(text: str, scripts: frozenset[str]) -> str:
    """``text`` with the letters of other scripts blanked out."""
    if "LATIN" in scripts and text.isascii():  # every ASCII letter is Latin
        return text
    return "".join(
        char if not char.isalpha() or script_of(char) in scripts else " " for char in text
    )


def has_letters(text: str) -> bool:
    return any(map(str.isalpha, text))


def sample(text: str, limit: int = SAMPLE_CHARS) -> str:
    """The first ``limit`` characters of ``text``, without a word cut in two."""
    if len(text) <= limit:
        return text
    head = text[:limit]
    cut = head.rfind(" ", limit // 2)
    return head[:cut] if cut > 0 else head


@dataclass(frozen=True)
class Detection:
    language: str
    confidence: float  # 0–100


@lru_cache(maxsize=1)
def _ngram_model():
    """py3langid over every language it knows, unnormalised: each language's naive-Bayes log
    score, from which one reading gives both the probabilities over every language and those
    among the served languages (a softmax over fewer classes of the same scores)."""
    from py3langid.langid import MODEL_FILE, LanguageIdentifier

    return LanguageIdentifier.from_model_file(MODEL_FILE, norm_probs=False)


def ngram_scores(text: str) -> np.ndarray:
    """Each of py3langid's classes' log score of ``text`` (a script alias holding its
    language's best), divided by py3langid's temperature: the square root of the text's
    length in UTF-8 bytes, which keeps its probabilities calibrated across lengths. A softmax
    over any set of classes gives their probabilities."""
    if text.isupper():  # py3langid reads an all-capitals text in lower case
        text = text.lower()
    length = len(unicodedata.normalize("NFC", text).encode("utf8", errors="surrogatepass"))
    # _decide is py3langid's scoring of one text (rank() without its per-language dict)
    scores = np.asarray(_ngram_model()._decide(text), dtype=np.float64)
    return scores / math.sqrt(length or 1)


def softmax(scores: np.ndarray) -> np.ndarray:
    weights = np.exp(scores - scores.max())
    return weights / weights.sum()


class LanguageDetector:
    """Detects among ``languages``; those the detection model does not know are left out.
    ``use_words=False``: py3langid alone (the comparison in bench/detection.py)."""

    def __init__(self, languages: Iterable[str], use_words: bool = True) -> None:
        wanted = sorted(set(languages))
        classes = list(_ngram_model().nb_classes)
        self.languages = tuple(code for code in wanted if code in classes)
        if unknown := [code for code in wanted if code not in classes]:
            logger.warning("language detection cannot recognise %s", ", ".join(unknown))
        # the class of each served language (its first; an alias holds the language's best)
        self._served = np.array([classes.index(code) for code in self.languages], dtype=np.intp)
        self._classes = np.array(classes)
        self._unserved_classes = np.array([code not in self.languages for code in classes])
        self._scripts = frozenset().union(*(SCRIPTS.get(code, _LATIN) for code in self.languages))
        # The served languages' words, where each has a list: one language's words counted
        # and another's not would tip every text. They decide among two or more served
        # languages; the unserved languages' reading needs them for one served language too.
        served_tables: list[WordTable] = []
        if use_words and self.languages and all(map(has_word_list, self.languages)):
            tables = [word_log_frequencies(code) for code in self.languages]
            served_tables = [table for table in tables if table is not None]
        elif use_words and len(self.languages) > 1:
            logger.warning("no word list for every served language: n-grams alone")
        self._words_decide = bool(served_tables) and len(self.languages) > 1
        self._links = tuple(COMPOUND_LINKS.get(code, ("",)) for code in self.languages)
        # The unserved languages of the served scripts whose common words wordfreq lists,
        # read beside the served ones' words (the module's docstring).
        others = [
            code
            for code in sorted(set(classes) - set(self.languages))
            if served_tables and SCRIPTS.get(code, _LATIN) & self._scripts
        ]
        other_tables = [(code, common_word_log_frequencies(code)) for code in others]
        self._others = tuple(code for code, table in other_tables if table is not None)
        # One merged table: the served languages' words, then the unserved ones', so that a
        # text's words are looked up once for every language.
        self._words: WordTables | None = None
        if served_tables:
            unserved_tables = [table for _, table in other_tables if table is not None]
            self._words = WordTables([*served_tables, *unserved_tables])
        self._with_others = np.array(
            [*self._served, *(classes.index(code) for code in self._others)], dtype=np.intp
        )

    def _reading(self, words: list[str], hashed: dict[str, int]) -> TextWords | None:
        """``words`` (distinct) to look up in the word lists; None without word lists."""
        return None if self._words is None else TextWords(words, self._words, hashed)

    def _unserved(self, scores: np.ndarray) -> Detection | None:
        """The likeliest language the service does not translate from, when the text read
        as ``scores`` is almost surely in one of those; else None."""
        everything = softmax(scores)
        if 1.0 - float(everything[self._served].sum()) < UNSERVED_CONFIDENCE:
            return None
        best = int(np.argmax(np.where(self._unserved_classes, scores, -np.inf)))
        probability = everything[self._classes == self._classes[best]].sum()
        return Detection(str(self._classes[best]), round(100.0 * float(probability), 1))

    def _unserved_by_words(self, scores: np.ndarray, text: TextWords | None) -> Detection | None:
        """The likeliest unserved language when the n-grams (``scores``) and the words of
        ``text``, read over the served languages and the unserved ones with word lists, give
        those at least ``UNSERVED_WORDS_CONFIDENCE``; else None."""
        if not self._others or text is None or not text.words:
            return None
        floor = math.log(UNSERVED_MIN_FREQUENCY)
        ngrams = softmax(scores[self._with_others])
        combined = []
        served = text.scores(self._links)
        # an unserved language's unlisted word counts as the floor, as does a rarer listed one
        listed = np.fmax(text.listed()[len(self.languages) :], floor).tolist()
        for index in range(len(self.languages) + len(self._others)):
            found: Iterable[float]
            if index < len(self.languages):
                found = (max(score, floor) for score in served[index])
            else:
                found = listed[index - len(self.languages)]
            probability = max(float(ngrams[index]), 1e-300)
            combined.append(NGRAM_WEIGHT * math.log(probability) + sum(found))
        others = softmax(np.array(combined))[len(self.languages) :]
        if float(others.sum()) < UNSERVED_WORDS_CONFIDENCE:
            return None
        best = int(np.argmax(others))
        return Detection(self._others[best], round(100.0 * float(others[best]), 1))

    def detect(self, texts: str | Sequence[str]) -> list[Detection]:
        """Candidates, best first (at most TOP_CANDIDATES). Text with nothing to go on (no
        letters outside placeholders, or no recognisable language served) gives the first
        served language with confidence 0."""
        joined = texts if isinstance(texts, str) else "\n".join(texts)
        bare = PLACEHOLDER_RE.sub(" ", sample(joined))
        if not self.languages or not has_letters(bare):
            return [Detection(self.languages[0] if self.languages else "en", 0.0)]
        # The unserved languages are judged on the letters of the served languages' scripts
        # (the module's docstring); the served ones on the whole text.
        readable = in_scripts(bare, self._scripts)
        # Each word once: a repeated word is no more evidence of a language, and a word that
        # is common in an unserved language too ("save" is Lithuanian) would count as often as
        # it is repeated.
        hashed: dict[str, int] = {}  # the words' hashes, shared by both readings
        words = self._reading(list(dict.fromkeys(words_of(readable))), hashed)
        readable_scores = ngram_scores(readable) if has_letters(readable) else None
        if (
            readable_scores is not None
            and (unserved := self._unserved(readable_scores)) is not None
        ):
            return [unserved]
        if readable_scores is not None and (
            unserved := self._unserved_by_words(readable_scores, words)
        ):
            return [unserved]
        if len(self.languages) == 1:  # one class: its normalised probability is 1, unscored
            return [Detection(self.languages[0], 100.0)]
        # Most texts are all in the served scripts: their one reading serves both.
        scores = readable_scores if readable == bare else ngram_scores(bare)
        assert scores is not None  # bare has letters, so readable == bare has too
        ngrams = softmax(scores[self._served]).tolist()
        if not self._words_decide:
            ranked = sorted(
                zip(self.languages, ngrams, strict=True), key=lambda pair: pair[1], reverse=True
            )
            return [
                Detection(code, round(100.0 * score, 1)) for code, score in ranked[:TOP_CANDIDATES]
            ]
        # Here every word counts as often as it occurs.
        every_word = words_of(bare)
        if readable != bare:
            words = self._reading(list(dict.fromkeys(every_word)), hashed)
        assert words is not None  # the words decide: there are tables
        score_of = dict(zip(words.words, zip(*words.scores(self._links), strict=True), strict=True))
        combined = [
            NGRAM_WEIGHT * math.log(max(probability, 1e-300))
            + sum(score_of[word][index] for word in every_word)
            for index, probability in enumerate(ngrams)
        ]
        best = max(combined)
        weights = [math.exp(score - best) for score in combined]
        total = sum(weights)
        ranked = sorted(
            zip(self.languages, weights, strict=True), key=lambda pair: pair[1], reverse=True
        )
        return [
            Detection(code, round(100.0 * weight / total, 1))
            for code, weight in ranked[:TOP_CANDIDATES]
        ]
