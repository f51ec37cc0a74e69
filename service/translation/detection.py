"""Which language a text is in, among the languages the service translates from.

py3langid (a maintained fork of langid.py: a naive Bayes model over byte n-grams, 142
languages, numpy only, offline) restricted to the served source languages: a detector that
may answer "Catalan" when only en/de/fr are served is no use for routing, and restricting
the classes also makes short texts far less ambiguous. Confidences are normalised
probabilities over the served languages, reported 0–100 as LibreTranslate does.

A batch of texts passed together gets one detection (LibreTranslate detects once per request,
since one model translates the whole request): the texts are scored together. ``/v1`` calls
:meth:`LanguageDetector.detect` once per text instead (service/translation/dispatch.py).

The base model (about 1.5 s to load) is read once per process and shared; each set of
languages gets its own restricted copy of the class tables. Classification only reads them,
so one detector serves every thread.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import lru_cache

logger = logging.getLogger(__name__)

# Detected languages reported per text (LibreTranslate's /detect gives its top candidates).
TOP_CANDIDATES = 3


@dataclass(frozen=True)
class Detection:
    language: str
    confidence: float  # 0–100


@lru_cache(maxsize=1)
def _base_identifier():
    from py3langid.langid import MODEL_FILE, LanguageIdentifier

    return LanguageIdentifier.from_model_file(MODEL_FILE, norm_probs=True)


@lru_cache(maxsize=16)
def _restricted_identifier(languages: tuple[str, ...]):
    from py3langid.langid import LanguageIdentifier

    base = _base_identifier()
    ptc, pc, classes = base._full_model
    identifier = LanguageIdentifier(
        ptc, pc, classes, base.tk_nextmove, base.tk_output, norm_probs=True, tk_row=base.tk_row
    )
    identifier.set_languages(languages)
    return identifier


class LanguageDetector:
    """Detects among ``languages``; those the detection model does not know are left out."""

    def __init__(self, languages: Iterable[str]) -> None:
        wanted = sorted(set(languages))
        known = set(_base_identifier().labels)
        self.languages = tuple(code for code in wanted if code in known)
        if unknown := [code for code in wanted if code not in known]:
            logger.warning("language detection cannot recognise %s", ", ".join(unknown))
        self._identifier = _restricted_identifier(self.languages) if self.languages else None

    def detect(self, texts: str | Sequence[str]) -> list[Detection]:
        """Candidates, best first (at most TOP_CANDIDATES). Text with nothing to go on (no
        letters, or no recognisable language served) gives the first served language with
        confidence 0."""
        joined = texts if isinstance(texts, str) else "\n".join(texts)
        if self._identifier is None or not any(char.isalpha() for char in joined):
            return [Detection(self.languages[0] if self.languages else "en", 0.0)]
        if len(self.languages) == 1:  # one class: its normalised probability is 1, unscored
            return [Detection(self.languages[0], 100.0)]
        ranked = self._identifier.rank(joined)[:TOP_CANDIDATES]
        return [Detection(code, round(100.0 * score, 1)) for code, score in ranked]
