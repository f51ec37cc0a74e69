"""Where a request goes: check its texts, detect its source where it says ``auto``, choose
the route (direct, through a pivot, or the identity) to its target or the only one served
from there, and refuse a stored glossary or a memory of another pair, all before any model
is leased. :class:`RoutePlanner` makes the :class:`RoutePlan` that
service/translation/dispatch.py runs.

``/v1`` detects and routes each text of a list on its own (``Routing.EACH_TEXT``): a list
gives what its texts give alone, texts of different languages going to different models side
by side. LibreTranslate's ``/translate`` keeps one detection per request, as LibreTranslate
does.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field

from service.storage.memories import MemoryChoice, MemoryStore
from service.text.glossary import Glossary, GlossaryError
from service.text.limits import TextLimits
from service.text.plans import MemoryLookup
from service.translation.detection import Detection, LanguageDetector
from service.translation.languages import AUTO, LanguageCode, LanguagePair, language_name
from service.translation.registry import ModelRegistry
from service.translation.request import Routing, TranslationRequest
from service.translation.routing import (
    Route,
    UnsupportedLanguage,
    check_known,
    plan_route,
    source_languages,
)

# Detection is quick (tens of microseconds per short text) but scales with the text: large
# requests detect in a worker thread, like tokenizing.
_DETECT_IN_THREAD_CHARS = 20_000


@dataclass(frozen=True)
class RoutePlan:
    """Where a request's texts go, and what detection found."""

    route: Route  # the first text's, when the texts were routed one by one
    detections: list[Detection] | None  # when the source was detected
    # Texts detected and routed one by one (``Routing.EACH_TEXT``): each text's route and its
    # best detection, in input order. None: one route (and detection) for all.
    routes: list[Route] | None = None
    text_detections: list[Detection] | None = None
    # Each route's translation memory lookup (None: none), found while planning: the
    # dispatcher uses it rather than asking the store again.
    memories: dict[Route, MemoryLookup | None] = field(default_factory=dict, compare=False)

    def route_of(self, index: int) -> Route:
        return self.routes[index] if self.routes is not None else self.route

    def detection_of(self, index: int) -> Detection | None:
        if self.text_detections is not None:
            return self.text_detections[index]
        return self.detections[0] if self.detections else None

    @property
    def models(self) -> list[str]:
        """Every model that runs, in order of first use over the texts."""
        routes = self.routes if self.routes is not None else [self.route]
        return list(dict.fromkeys(leg for route in routes for leg in route.legs))

    @property
    def split(self) -> bool:
        """Whether the texts take more than one route."""
        return self.routes is not None and len(set(self.routes)) > 1


class RoutePlanner:
    """Plans requests over the models ``registry`` serves."""

    def __init__(
        self,
        registry: ModelRegistry,
        detector: LanguageDetector | None,
        limits: TextLimits,
        pivot_lang: str = "en",
        memories: MemoryStore | None = None,
    ) -> None:
        """``pivot_lang``: X→Y without a direct model goes X→pivot→Y (empty: never);
        ``memories``: the translation memories requests use (service/storage/memories.py)."""
        self.registry = registry
        self.detector = detector
        self.limits = limits
        self.pivot_lang = pivot_lang
        self.memories = memories

    async def detect(self, texts: str | Sequence[str]) -> list[Detection]:
        """Candidates among the served source languages, best first."""
        if self.detector is None:
            raise UnsupportedLanguage(
                "detection_disabled", "language detection is off (MT_LANGUAGE_DETECTION)"
            )
        # The limits of a translation: detection reads a sample of each text, but a request of
        # many or long texts is still one a client could not have translated.
        self.limits.check_request_size([texts] if isinstance(texts, str) else texts)
        size = len(texts) if isinstance(texts, str) else sum(map(len, texts))
        if size > _DETECT_IN_THREAD_CHARS:
            return await asyncio.to_thread(self.detector.detect, texts)
        return self.detector.detect(texts)

    def default_target(self, source: str) -> str:
        """The target when the client names none: the only one served from ``source``."""
        targets = sorted({t for s, t in self.registry.by_pair if s == source})
        if len(self.registry.by_pair) == 1:
            [(_, target)] = self.registry.by_pair
            return target
        if len(targets) == 1:
            return targets[0]
        if not targets:  # nothing translates from it (a language detected that nobody serves)
            check_known((source,), self.registry.by_pair)
            raise UnsupportedLanguage(
                "unsupported_pair",
                f"{language_name(source)} ({source}) is not available as a source language",
            )
        raise UnsupportedLanguage("missing_target", "Invalid request: missing target parameter")

    def route(self, languages: LanguagePair) -> Route:
        """The route of a named source and target (an unserved pair is refused)."""
        return plan_route(languages, self.registry.by_pair, self.pivot_lang)

    async def plan(self, request: TranslationRequest) -> RoutePlan:
        """Check the texts, detect the source if asked to, choose the routes (counted); a
        stored glossary or a memory for another pair is refused here, before any model is
        leased."""
        texts, languages = request.texts, request.languages
        self.limits.check_request_size(texts)
        if (
            request.routing is Routing.EACH_TEXT
            and len(texts) > 1
            and self._detects_many(languages)
        ):
            return await self._plan_each(request)
        source, detections = await self._resolve_source(texts, languages.source)
        memories: dict[Route, MemoryLookup | None] = {}
        return RoutePlan(
            self._choose_route(request, source, memories), detections, memories=memories
        )

    async def _resolve_source(
        self, texts: Sequence[str], source: LanguageCode
    ) -> tuple[LanguageCode, list[Detection] | None]:
        """The source language: the client's, or detected for ``auto``."""
        if source.code != AUTO:
            return source, None
        sources = source_languages(self.registry.by_pair)
        if self.detector is None:
            if len(sources) == 1:
                return LanguageCode(sources[0]), [Detection(sources[0], 100.0)]
            raise UnsupportedLanguage(
                "detection_disabled",
                "source 'auto' needs language detection, which is off (MT_LANGUAGE_DETECTION)",
            )
        detections = await self.detect(texts)
        return LanguageCode(detections[0].language), detections

    def _detects_many(self, languages: LanguagePair) -> bool:
        """Whether the source is detected among more than one served language."""
        return (
            languages.detects
            and self.detector is not None
            and len(source_languages(self.registry.by_pair)) > 1
        )

    async def _plan_each(self, request: TranslationRequest) -> RoutePlan:
        """Each text's route and best detection, detected alone (routes counted once per
        distinct route, as a request each)."""
        texts, detector = request.texts, self.detector
        assert detector is not None  # _detects_many
        if sum(map(len, texts)) > _DETECT_IN_THREAD_CHARS:
            ranked = await asyncio.to_thread(lambda: [detector.detect(text) for text in texts])
        else:
            ranked = [detector.detect(text) for text in texts]
        detections = [candidates[0] for candidates in ranked]
        by_source: dict[str, Route] = {}
        memories: dict[Route, MemoryLookup | None] = {}
        for detection in detections:
            if detection.language not in by_source:
                source = LanguageCode(detection.language)
                by_source[detection.language] = self._choose_route(request, source, memories)
        routes = [by_source[detection.language] for detection in detections]
        return RoutePlan(routes[0], [detections[0]], routes, detections, memories)

    def _choose_route(
        self,
        request: TranslationRequest,
        source: LanguageCode,
        memories: dict[Route, MemoryLookup | None],
    ) -> Route:
        """The route from ``source`` (named or detected) to the request's target (or the
        only one served from there), counted; its glossary checked and its memory found
        (into ``memories``)."""
        target = request.languages.target
        if not target.code:
            target = LanguageCode(self.default_target(source.code))
        route = self.route(LanguagePair(source, target))
        check_glossary_pair(request.glossary, route.source, route.target)
        memories[route] = self.memory(request.memory, route)  # refused here, before a lease
        kind = "identity" if not route.legs else "pivot" if route.pivot else "direct"
        self.registry.metrics.routes.labels(kind=kind).inc()
        return route

    def memory(self, memory: MemoryChoice, route: Route) -> MemoryLookup | None:
        """The approved translations ``route`` uses: none for the identity (nothing is
        translated); 404 or 400 for a named memory that is unknown or of another pair."""
        if self.memories is None or not route.legs:
            return None
        return self.memories.lookup(memory, route.source, route.target)


def check_glossary_pair(glossary: Glossary | None, source: str, target: str) -> None:
    """A stored glossary holds for its own language pair only: its terms are in the wrong
    language for any other, and matching them there would be silently wrong."""
    if glossary is None or glossary.source_lang is None:
        return
    if (glossary.source_lang, glossary.target_lang) != (source, target):
        raise GlossaryError(
            "glossary_language_mismatch",
            f"the glossary is for {glossary.source_lang}->{glossary.target_lang}, "
            f"the request is {source}->{target}",
        )
