"""One request, many models: detect the source language, choose the route, lease the
models, translate.

The web layer calls :meth:`Dispatcher.translate` with the client's texts and languages;
everything here is the service's own vocabulary (domain errors, no HTTP). Validation that
needs no model (texts, characters, decoding options) runs first, so a bad request never waits
for a model to load.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass

from service.text.glossary import Glossary, GlossaryError
from service.text.pipeline import (
    DecodingOptions,
    TextLimits,
    TextTranslation,
    TranslationBatch,
)
from service.translation.detection import Detection, LanguageDetector
from service.translation.languages import normalise_language_code
from service.translation.registry import ModelRegistry
from service.translation.routing import Route, UnsupportedLanguage, plan_route, source_languages
from service.translation.translator import SentenceDone

AUTO = "auto"
# Detection is quick (tens of microseconds per short text) but scales with the text: large
# requests detect in a worker thread, like tokenizing.
_DETECT_IN_THREAD_CHARS = 20_000


@dataclass(frozen=True)
class DispatchResult:
    batch: TranslationBatch
    route: Route
    detections: list[Detection] | None  # when the source was "auto"


class Dispatcher:
    def __init__(
        self,
        registry: ModelRegistry,
        detector: LanguageDetector | None,
        limits: TextLimits,
        pivot_lang: str = "en",
    ) -> None:
        """``pivot_lang``: X→Y without a direct model goes X→pivot→Y (empty: never)."""
        self.registry = registry
        self.detector = detector
        self.limits = limits
        self.pivot_lang = pivot_lang

    async def detect(self, texts: str | Sequence[str]) -> list[Detection]:
        """Candidates among the served source languages, best first."""
        if self.detector is None:
            raise UnsupportedLanguage(
                "detection_disabled", "language detection is off (MT_LANGUAGE_DETECTION)"
            )
        size = len(texts) if isinstance(texts, str) else sum(map(len, texts))
        if size > _DETECT_IN_THREAD_CHARS:
            return await asyncio.to_thread(self.detector.detect, texts)
        return self.detector.detect(texts)

    async def resolve_source(
        self, texts: Sequence[str], source: str | None
    ) -> tuple[str, list[Detection] | None]:
        """The source language: the client's, or detected for ``auto`` / none."""
        source = normalise_language_code(source) or AUTO  # `EN`, ` de `: as clients send them
        if source != AUTO:
            return source, None
        sources = source_languages(self.registry.by_pair)
        if self.detector is None:
            if len(sources) == 1:
                return sources[0], [Detection(sources[0], 100.0)]
            raise UnsupportedLanguage(
                "detection_disabled",
                "source 'auto' needs language detection, which is off (MT_LANGUAGE_DETECTION)",
            )
        detections = await self.detect(texts)
        return detections[0].language, detections

    def default_target(self, source: str) -> str:
        """The target when the client names none: the only one served from ``source``."""
        targets = sorted({t for s, t in self.registry.by_pair if s == source})
        if len(self.registry.by_pair) == 1:
            [(_, target)] = self.registry.by_pair
            return target
        if len(targets) == 1:
            return targets[0]
        raise UnsupportedLanguage("missing_target", "Invalid request: missing target parameter")

    def route(self, source: str, target: str) -> Route:
        return plan_route(source, target, self.registry.by_pair, self.pivot_lang)

    async def translate(
        self,
        texts: Sequence[str],
        source: str | None,
        target: str | None,
        options: DecodingOptions,
        glossary: Glossary | None = None,
    ) -> DispatchResult:
        """``glossary``: terms enforced on the request (service/text/glossary.py); a stored
        one must be for the route's language pair."""
        route, detections = await self.plan(texts, source, target, glossary)
        return DispatchResult(await self._run(texts, route, options, glossary), route, detections)

    async def translate_with_alternatives(
        self,
        texts: Sequence[str],
        source: str | None,
        target: str | None,
        options: DecodingOptions,
        alternatives: int,
        glossary: Glossary | None = None,
    ) -> tuple[DispatchResult, list[list[str]]]:
        """:meth:`translate` with up to ``alternatives`` other translations per text from the
        beam's n-best (``Translator.translate_with_alternatives``). A direct route only: a
        pivot's two beams have no single n-best, and the identity has no beam; those get []."""
        route, detections = await self.plan(texts, source, target, glossary)
        if len(route.legs) != 1:
            batch = await self._run(texts, route, options, glossary)
            return DispatchResult(batch, route, detections), [[] for _ in texts]
        async with self.registry.lease(route.legs) as [translator]:
            batch, others = await translator.translate_with_alternatives(
                texts, options, alternatives, glossary
            )
        return DispatchResult(batch, route, detections), others

    async def stream(
        self,
        texts: Sequence[str],
        source: str | None,
        target: str | None,
        options: DecodingOptions,
        glossary: Glossary | None = None,
    ) -> DispatchStream:
        """The sentences of ``texts`` as they finish (``Translator.stream``), then the batch.
        Refusals (limits, language, queue full) raise here. The model stays leased until the
        stream ends or is closed. A pivot (or identity) route yields only the batch: a
        sentence is done when its second leg is, and the legs run text by text."""
        route, detections = await self.plan(texts, source, target, glossary)
        resources = AsyncExitStack()
        if len(route.legs) != 1:
            return DispatchStream(
                route,
                detections,
                _once(lambda: self._run(texts, route, options, glossary)),
                resources,
            )
        try:
            [translator] = await resources.enter_async_context(self.registry.lease(route.legs))
            items = await translator.stream(texts, options, glossary)
        except BaseException:
            await resources.aclose()
            raise
        return DispatchStream(route, detections, items, resources)

    async def plan(
        self,
        texts: Sequence[str],
        source: str | None,
        target: str | None,
        glossary: Glossary | None = None,
    ) -> tuple[Route, list[Detection] | None]:
        """Check the texts, detect the source if asked to, choose the route (counted); a
        stored glossary for another pair is refused here, before any model is leased."""
        self.limits.check_request_size(texts)
        source, detections = await self.resolve_source(texts, source)
        target = normalise_language_code(target) or self.default_target(source)
        route = self.route(source, target)
        check_glossary_pair(glossary, route.source, route.target)
        kind = "identity" if not route.legs else "pivot" if route.pivot else "direct"
        self.registry.metrics.routes.labels(kind=kind).inc()
        return route, detections

    async def _run(
        self,
        texts: Sequence[str],
        route: Route,
        options: DecodingOptions,
        glossary: Glossary | None = None,
    ) -> TranslationBatch:
        if not route.legs:
            return _unchanged(texts)
        async with self.registry.lease(route.legs) as translators:
            first, *rest = translators
            return await first.translate(
                texts, options, then=rest[0] if rest else None, glossary=glossary
            )


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


class DispatchStream:
    """What :meth:`Dispatcher.stream` returns: ``SentenceDone`` items and, last, the
    ``TranslationBatch``; ``aclose()`` drops unfinished rows and releases the model."""

    def __init__(
        self,
        route: Route,
        detections: list[Detection] | None,
        items: AsyncIterator[SentenceDone | TranslationBatch],
        resources: AsyncExitStack,
    ) -> None:
        self.route = route
        self.detections = detections
        self._items = items
        self._resources = resources

    def __aiter__(self) -> DispatchStream:
        return self

    async def __anext__(self) -> SentenceDone | TranslationBatch:
        return await anext(self._items)

    async def aclose(self) -> None:
        try:
            await self._items.aclose()  # type: ignore[attr-defined]
        finally:
            await self._resources.aclose()


async def _once(
    work: Callable[[], Awaitable[TranslationBatch]],
) -> AsyncIterator[TranslationBatch]:
    yield await work()


def _unchanged(texts: Sequence[str]) -> TranslationBatch:
    """Source and target are the same language: the texts as they are."""
    return TranslationBatch(
        translations=[TextTranslation(text, 0, 0) for text in texts],
        input_tokens=0,
        output_tokens=0,
        decoded_sentences=0,
        cached_sentences=0,
    )
