"""Which models translate X→Y: a direct model, else a pivot through one language (English).

Pure functions over the served language pairs: no models, no I/O. A direct model always wins
over a pivot; a pivot X→P→Y needs both X→P and P→Y. A multilingual model serves every pair
of its languages, so it is "direct" for each (service/translation/registry.py decides which
model holds a pair: one of that pair alone first). Same source and target is the identity
(the text comes back unchanged, no model runs), as a translation service that is asked to
translate German into German should do.

Refusals use LibreTranslate's messages (its clients show them to people):
``"xx is not supported"`` for a code no model knows, and ``"French (fr) is not available as
a target language from German (de)"`` for known languages without a route.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from service.errors import UnsupportedLanguage
from service.translation.languages import LanguagePair, language_name

Pair = tuple[str, str]


@dataclass(frozen=True)
class Route:
    """The models that run, in order: one (direct), two (pivot) or none (identity)."""

    source: str
    target: str
    legs: tuple[str, ...]  # model ids
    via: str = ""  # the pivot language, for a pivot
    # The languages as the client spelt them (``deu_Latn`` or ``de``); "": the canonical code.
    source_spelling: str = ""
    target_spelling: str = ""

    @property
    def pivot(self) -> bool:
        return len(self.legs) > 1

    @property
    def leg_pairs(self) -> tuple[Pair, ...]:
        """The (source, target) each leg translates, in canonical codes."""
        if self.pivot:
            return (self.source, self.via), (self.via, self.target)
        return ((self.source, self.target),) if self.legs else ()

    @property
    def shown_source(self) -> str:
        return self.source_spelling or self.source

    @property
    def shown_target(self) -> str:
        return self.target_spelling or self.target


def plan_route(pair: LanguagePair, models: Mapping[Pair, str], pivot_lang: str) -> Route:
    """The route for ``pair`` (a source named or detected, a target named or chosen) over
    ``models`` ((source, target) -> model id)."""
    source, target = pair.source.code, pair.target.code
    spelling = {"source_spelling": pair.source.shown, "target_spelling": pair.target.shown}
    if (direct := models.get((source, target))) is not None:  # the common case, first
        return Route(source, target, (direct,), **spelling)
    # A multilingual model makes tens of thousands of pairs: the codes are collected only
    # when no direct model answers.
    check_known((source, target), models)
    if source == target:
        return Route(source, target, (), **spelling)
    if pivot_lang and (
        (first := models.get((source, pivot_lang))) is not None
        and (second := models.get((pivot_lang, target))) is not None
    ):
        return Route(source, target, (first, second), pivot_lang, **spelling)
    raise UnsupportedLanguage(
        "unsupported_pair",
        f"{language_name(target)} ({target}) is not available as a target language from "
        f"{language_name(source)} ({source})",
    )


def check_known(codes: Iterable[str], pairs: Iterable[Pair]) -> None:
    """Refuse (LibreTranslate's message) the first of ``codes`` that no served pair has."""
    known = {code for pair in pairs for code in pair}
    for code in codes:
        if code not in known:
            raise UnsupportedLanguage("unsupported_language", f"{code} is not supported")


def targets_by_source(pairs: Iterable[Pair], pivot_lang: str) -> dict[str, list[str]]:
    """Every served language -> the languages it translates into (direct or by pivot),
    sorted; languages that are only targets map to []."""
    pairs = set(pairs)
    targets: dict[str, set[str]] = {code: set() for pair in pairs for code in pair}
    for source, target in pairs:
        targets[source].add(target)
    from_pivot = set(targets.get(pivot_lang, ())) if pivot_lang else set()
    for source, found in targets.items():
        if pivot_lang in found:
            found.update(from_pivot - {source})
    return {code: sorted(found) for code, found in sorted(targets.items())}


def source_languages(pairs: Iterable[Pair]) -> list[str]:
    """Languages some model translates from (what detection chooses among)."""
    return sorted({source for source, _ in pairs})
