"""Which models translate X→Y: a direct model, else a pivot through one language (English).

Pure functions over the served language pairs: no models, no I/O. A direct model always wins
over a pivot; a pivot X→P→Y needs both X→P and P→Y. Same source and target is the identity
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
from service.translation.languages import language_name, normalise_language_code

Pair = tuple[str, str]


@dataclass(frozen=True)
class Route:
    """The models that run, in order: one (direct), two (pivot) or none (identity)."""

    source: str
    target: str
    legs: tuple[str, ...]  # model ids

    @property
    def pivot(self) -> bool:
        return len(self.legs) > 1


def plan_route(source: str, target: str, models: Mapping[Pair, str], pivot_lang: str) -> Route:
    """The route for ``source``→``target`` over ``models`` ((source, target) -> model id)."""
    source, target = normalise_language_code(source), normalise_language_code(target)
    known = {code for pair in models for code in pair}
    for code in (source, target):
        if code not in known:
            raise UnsupportedLanguage("unsupported_language", f"{code} is not supported")
    if source == target:
        return Route(source, target, ())
    if (direct := models.get((source, target))) is not None:
        return Route(source, target, (direct,))
    if pivot_lang and (
        (first := models.get((source, pivot_lang))) is not None
        and (second := models.get((pivot_lang, target))) is not None
    ):
        return Route(source, target, (first, second))
    raise UnsupportedLanguage(
        "unsupported_pair",
        f"{language_name(target)} ({target}) is not available as a target language from "
        f"{language_name(source)} ({source})",
    )


def targets_by_source(pairs: Iterable[Pair], pivot_lang: str) -> dict[str, list[str]]:
    """Every served language -> the languages it translates into (direct or by pivot),
    sorted; languages that are only targets map to []."""
    pairs = set(pairs)
    targets: dict[str, set[str]] = {code: set() for pair in pairs for code in pair}
    for source, target in pairs:
        targets[source].add(target)
        if pivot_lang and target == pivot_lang:
            targets[source].update(t for s, t in pairs if s == pivot_lang and t != source)
    return {code: sorted(found) for code, found in sorted(targets.items())}


def source_languages(pairs: Iterable[Pair]) -> list[str]:
    """Languages some model translates from (what detection chooses among)."""
    return sorted({source for source, _ in pairs})
