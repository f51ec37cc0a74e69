"""One request, many models: detect the source language, choose the route, lease the
models, translate.

``/v1`` detects and routes each text of a list on its own (``each_text``): a list gives what
its texts give alone, texts of different languages going to different models side by side.
LibreTranslate's ``/translate`` keeps one detection per request, as LibreTranslate does.

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
    MemoryLookup,
    TextLimits,
    TextTranslation,
    TranslationBatch,
)
from service.translation.detection import Detection, LanguageDetector
from service.translation.languages import normalise_language_code
from service.translation.memories import PAIR_DEFAULT, MemoryChoice, MemoryStore
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
    route: Route  # the first text's, when the texts were routed one by one
    detections: list[Detection] | None  # when the source was "auto"
    # Texts detected and routed one by one (``each_text``): each text's route and its best
    # detection, in input order. None: one route (and detection) for all.
    routes: list[Route] | None = None
    text_detections: list[Detection] | None = None

    def route_of(self, index: int) -> Route:
        return self.routes[index] if self.routes is not None else self.route

    def detection_of(self, index: int) -> Detection | None:
        if self.text_detections is not None:
            return self.text_detections[index]
        return self.detections[0] if self.detections else None

    @property
    def models(self) -> list[str]:
        """Every model that ran, in order of first use over the texts."""
        routes = self.routes if self.routes is not None else [self.route]
        return list(dict.fromkeys(leg for route in routes for leg in route.legs))


class Dispatcher:
    def __init__(
        self,
        registry: ModelRegistry,
        detector: LanguageDetector | None,
        limits: TextLimits,
        pivot_lang: str = "en",
        memories: MemoryStore | None = None,
    ) -> None:
        """``pivot_lang``: X→Y without a direct model goes X→pivot→Y (empty: never);
        ``memories``: the translation memories requests use (service/translation/memories.py)."""
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
        each_text: bool = False,
        memory: MemoryChoice = PAIR_DEFAULT,
    ) -> DispatchResult:
        """``glossary``: terms enforced on the request (service/text/glossary.py); a stored
        one must be for the language pair of every route the texts take; so must ``memory``
        where it names one (by default each route uses its pair's default memory, if there
        is one). ``each_text``: with
        a detected source, each text is detected and routed on its own (``/v1``), so a text's
        translation does not depend on its neighbours; else one detection over all texts picks
        one route (LibreTranslate's contract)."""
        detections: list[Detection] | None
        if each_text and len(texts) > 1 and self.detects_each(source):
            routes, detections = await self.plan_each(texts, target, glossary, memory)
            if len(set(routes)) > 1:
                batch = await self._run_each(texts, routes, options, glossary, memory)
            else:  # one route for all: one batch, as a request with a given source
                batch = await self._run(texts, routes[0], options, glossary, memory)
            return DispatchResult(batch, routes[0], [detections[0]], routes, detections)
        route, detections = await self.plan(texts, source, target, glossary, memory)
        batch = await self._run(texts, route, options, glossary, memory)
        return DispatchResult(batch, route, detections)

    def pair_translator(
        self, source: str, target: str, options: DecodingOptions
    ) -> Callable[[list[str]], Awaitable[list[str]]]:
        """Texts of one document → their translations, all by one pair: a named source is
        routed now (an unserved pair is refused before any work); ``auto`` is detected once,
        on the first texts translated, and kept for the rest of the document."""
        chosen: list[tuple[str, str]] = []
        if normalise_language_code(source) != AUTO:
            route = self.route(source, target)
            chosen.append((route.source, route.target))

        async def translate_texts(texts: list[str]) -> list[str]:
            if not chosen:
                planned, _ = await self.plan(texts, AUTO, target)
                chosen.append((planned.source, planned.target))
            result = await self.translate(texts, *chosen[0], options)
            return [translation.text for translation in result.batch.translations]

        return translate_texts

    def detects_each(self, source: str | None) -> bool:
        """Whether ``source`` asks for detection among more than one served language."""
        return (
            (normalise_language_code(source) or AUTO) == AUTO
            and self.detector is not None
            and len(source_languages(self.registry.by_pair)) > 1
        )

    async def plan_each(
        self,
        texts: Sequence[str],
        target: str | None,
        glossary: Glossary | None = None,
        memory: MemoryChoice = PAIR_DEFAULT,
    ) -> tuple[list[Route], list[Detection]]:
        """Each text's route and best detection, detected alone (routes counted once per
        distinct route, as a request each)."""
        self.limits.check_request_size(texts)
        detector = self.detector
        assert detector is not None  # detects_each
        if sum(map(len, texts)) > _DETECT_IN_THREAD_CHARS:
            ranked = await asyncio.to_thread(lambda: [detector.detect(text) for text in texts])
        else:
            ranked = [detector.detect(text) for text in texts]
        detections = [candidates[0] for candidates in ranked]
        sent_target, target = target, normalise_language_code(target)
        routes_by_source: dict[str, Route] = {}
        for detection in detections:
            if detection.language not in routes_by_source:
                source = detection.language
                route = self.route(
                    source, (sent_target or target) if target else self.default_target(source)
                )
                check_glossary_pair(glossary, route.source, route.target)
                self.memory_lookup(memory, route)  # refused here, before a lease
                kind = "identity" if not route.legs else "pivot" if route.pivot else "direct"
                self.registry.metrics.routes.labels(kind=kind).inc()
                routes_by_source[source] = route
        return [routes_by_source[d.language] for d in detections], detections

    async def _run_each(
        self,
        texts: Sequence[str],
        routes: Sequence[Route],
        options: DecodingOptions,
        glossary: Glossary | None = None,
        memory: MemoryChoice = PAIR_DEFAULT,
    ) -> TranslationBatch:
        """Each route's texts as one batch, the routes side by side (their models decode
        concurrently), the translations put back in input order."""
        groups: dict[Route, list[int]] = {}
        for index, route in enumerate(routes):
            groups.setdefault(route, []).append(index)
        async with asyncio.TaskGroup() as tasks:  # one refusal cancels the other routes
            running = {
                route: tasks.create_task(
                    self._run([texts[i] for i in indices], route, options, glossary, memory)
                )
                for route, indices in groups.items()
            }
        translations: list[TextTranslation | None] = [None] * len(texts)
        batches = []
        for route, indices in groups.items():
            batch = running[route].result()
            batches.append(batch)
            for index, translation in zip(indices, batch.translations, strict=True):
                translations[index] = translation
        return TranslationBatch(
            translations=[t for t in translations if t is not None],
            input_tokens=sum(b.input_tokens for b in batches),
            output_tokens=sum(b.output_tokens for b in batches),
            decoded_sentences=sum(b.decoded_sentences for b in batches),
            cached_sentences=sum(b.cached_sentences for b in batches),
            memory_sentences=sum(b.memory_sentences for b in batches),
        )

    async def translate_with_alternatives(
        self,
        texts: Sequence[str],
        source: str | None,
        target: str | None,
        options: DecodingOptions,
        alternatives: int,
        glossary: Glossary | None = None,
        memory: MemoryChoice = PAIR_DEFAULT,
    ) -> tuple[DispatchResult, list[list[str]]]:
        """:meth:`translate` with up to ``alternatives`` other translations per text from the
        beam's n-best (``Translator.translate_with_alternatives``). A direct route only: a
        pivot's two beams have no single n-best, and the identity has no beam; those get []."""
        route, detections = await self.plan(texts, source, target, glossary, memory)
        if len(route.legs) != 1:
            batch = await self._run(texts, route, options, glossary, memory)
            return DispatchResult(batch, route, detections), [[] for _ in texts]
        lookup = self.memory_lookup(memory, route)
        async with self.registry.lease(route.legs) as [translator]:
            translator = translator.for_pair(route.source, route.target)
            batch, others = await translator.translate_with_alternatives(
                texts, options, alternatives, glossary, lookup
            )
        return DispatchResult(batch, route, detections), others

    async def stream(
        self,
        texts: Sequence[str],
        source: str | None,
        target: str | None,
        options: DecodingOptions,
        glossary: Glossary | None = None,
        memory: MemoryChoice = PAIR_DEFAULT,
    ) -> DispatchStream:
        """The sentences of ``texts`` as they finish (``Translator.stream``), then the batch.
        Refusals (limits, language, queue full) raise here. The model stays leased until the
        stream ends or is closed. A pivot (or identity) route yields only the batch: a
        sentence is done when its second leg is, and the legs run text by text."""
        detections: list[Detection] | None
        if len(texts) > 1 and self.detects_each(source):
            # Detected text by text as /v1/translate does. Texts of more than one route give
            # only the batch, as a pivot does: one stream is one model's.
            routes, each = await self.plan_each(texts, target, glossary, memory)
            route, detections = routes[0], [each[0]]
            if len(set(routes)) > 1:
                return DispatchStream(
                    route,
                    detections,
                    _once(lambda: self._run_each(texts, routes, options, glossary, memory)),
                    AsyncExitStack(),
                    routes,
                    each,
                )
        else:
            route, detections = await self.plan(texts, source, target, glossary, memory)
            routes, each = None, None
        resources = AsyncExitStack()
        if len(route.legs) != 1:
            return DispatchStream(
                route,
                detections,
                _once(lambda: self._run(texts, route, options, glossary, memory)),
                resources,
                routes,
                each,
            )
        try:
            [translator] = await resources.enter_async_context(self.registry.lease(route.legs))
            translator = translator.for_pair(route.source, route.target)
            items = await translator.stream(
                texts, options, glossary, self.memory_lookup(memory, route)
            )
        except BaseException:
            await resources.aclose()
            raise
        return DispatchStream(route, detections, items, resources, routes, each)

    async def plan(
        self,
        texts: Sequence[str],
        source: str | None,
        target: str | None,
        glossary: Glossary | None = None,
        memory: MemoryChoice = PAIR_DEFAULT,
    ) -> tuple[Route, list[Detection] | None]:
        """Check the texts, detect the source if asked to, choose the route (counted); a
        stored glossary or a memory for another pair is refused here, before any model is
        leased."""
        self.limits.check_request_size(texts)
        sent_source, sent_target = source, target
        source, detections = await self.resolve_source(texts, source)
        target = normalise_language_code(target) or self.default_target(source)
        # Routed by the codes as sent, so that the route spells them as the client did.
        route = self.route(
            sent_source if detections is None and sent_source else source,
            (sent_target or target) if normalise_language_code(sent_target) else target,
        )
        check_glossary_pair(glossary, route.source, route.target)
        self.memory_lookup(memory, route)
        kind = "identity" if not route.legs else "pivot" if route.pivot else "direct"
        self.registry.metrics.routes.labels(kind=kind).inc()
        return route, detections

    def memory_lookup(self, memory: MemoryChoice, route: Route) -> MemoryLookup | None:
        """The approved translations ``route`` uses: none for the identity (nothing is
        translated); 404 or 400 for a named memory that is unknown or of another pair."""
        if self.memories is None or not route.legs:
            return None
        return self.memories.lookup(memory, route.source, route.target)

    async def _run(
        self,
        texts: Sequence[str],
        route: Route,
        options: DecodingOptions,
        glossary: Glossary | None = None,
        memory: MemoryChoice = PAIR_DEFAULT,
    ) -> TranslationBatch:
        if not route.legs:
            return _unchanged(texts)
        lookup = self.memory_lookup(memory, route)
        async with self.registry.lease(route.legs) as translators:
            # Each leg's model translates the leg's pair (a multilingual model serves many).
            first, *rest = (
                translator.for_pair(*pair)
                for translator, pair in zip(translators, route.leg_pairs, strict=True)
            )
            return await first.translate(
                texts, options, then=rest[0] if rest else None, glossary=glossary, memory=lookup
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
        routes: list[Route] | None = None,
        text_detections: list[Detection] | None = None,
    ) -> None:
        self.route = route
        self.detections = detections
        self.routes = routes
        self.text_detections = text_detections
        self._items = items
        self._resources = resources

    def __aiter__(self) -> DispatchStream:
        return self

    async def __anext__(self) -> SentenceDone | TranslationBatch:
        return await anext(self._items)

    def result(self, batch: TranslationBatch) -> DispatchResult:
        """The stream's last item as a :class:`DispatchResult`."""
        return DispatchResult(batch, self.route, self.detections, self.routes, self.text_detections)

    @property
    def models(self) -> list[str]:
        """Every model that runs, in order of first use over the texts."""
        routes = self.routes if self.routes is not None else [self.route]
        return list(dict.fromkeys(leg for route in routes for leg in route.legs))

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
