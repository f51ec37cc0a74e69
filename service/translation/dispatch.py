"""One request, many models: detect the source language, choose the route, lease the
models, translate.

:meth:`Dispatcher.translate` is the one way in. Every API hands it a
:class:`~service.translation.request.TranslationRequest`; it plans the request once (checks
the texts, detects the source, chooses the route, refuses a glossary or memory of another
pair), leases the route's models once and starts the translation once. What comes back is a
:class:`DispatchStream`: a streamed request's sentences as they finish, then, for every
request, the :class:`DispatchResult`. A caller that wants only the result awaits
:func:`collect`, as vLLM's non-streaming server reads ``generate()`` to its last output.

``/v1`` detects and routes each text of a list on its own (``Routing.EACH_TEXT``): a list
gives what its texts give alone, texts of different languages going to different models side
by side. LibreTranslate's ``/translate`` keeps one detection per request, as LibreTranslate
does. Everything here is the service's own vocabulary (domain errors, no HTTP). Validation that
needs no model (texts, characters, decoding options) runs first, so a bad request never waits
for a model to load.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from contextlib import AsyncExitStack, aclosing
from dataclasses import dataclass, replace

from service.storage.memories import PAIR_DEFAULT, MemoryChoice, MemoryStore
from service.text.bulk import TranslateTexts, translate_in_chunks
from service.text.glossary import Glossary, GlossaryError
from service.text.html import translate_html
from service.text.pipeline import (
    DecodingOptions,
    MemoryLookup,
    TextLimits,
    TextTranslation,
    TranslationBatch,
)
from service.translation.detection import Detection, LanguageDetector
from service.translation.languages import AUTO, LanguageCode, LanguagePair, language_name
from service.translation.registry import ModelRegistry
from service.translation.request import Output, Routing, TranslationRequest
from service.translation.routing import (
    Route,
    UnsupportedLanguage,
    check_known,
    plan_route,
    source_languages,
)
from service.translation.translator import SentenceDone, TranslationItems, once

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


@dataclass(frozen=True)
class DispatchResult:
    plan: RoutePlan
    batch: TranslationBatch  # each text's n-best in its ``alternatives``, when asked for


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
        ``memories``: the translation memories requests use (service/storage/memories.py)."""
        self.registry = registry
        self.detector = detector
        self.limits = limits
        self.pivot_lang = pivot_lang
        self.memories = memories

    async def translate(self, request: TranslationRequest) -> DispatchStream:
        """The one way in. Whatever refuses the request (limits, languages, a glossary or
        memory of another pair, queue full, a model not ready) raises here, before the
        stream. The models stay leased until the stream ends or is closed.

        ``Output.STREAM`` on one direct route yields each sentence as it finishes; a pivot
        (or identity) route yields only the result, since a sentence is done when its second
        leg is and the legs run text by text, and so do texts of several routes (one stream
        is one model's) and HTML (its units go in chunks)."""
        plan = await self._plan(request)
        if request.format == "html":
            return DispatchStream(plan, once(lambda: self._html(request, plan.route)))
        if plan.split:
            return DispatchStream(plan, once(lambda: self._run_each(request, plan)))
        return await self._start(request, plan)

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

    async def _plan(self, request: TranslationRequest) -> RoutePlan:
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
        return RoutePlan(self._admit(request, source), detections)

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
        for detection in detections:
            if detection.language not in by_source:
                source = LanguageCode(detection.language)
                by_source[detection.language] = self._admit(request, source)
        routes = [by_source[detection.language] for detection in detections]
        return RoutePlan(routes[0], [detections[0]], routes, detections)

    def _admit(self, request: TranslationRequest, source: LanguageCode) -> Route:
        """The route from ``source`` (named or detected) to the request's target (or the
        only one served from there), counted; its glossary and memory checked."""
        target = request.languages.target
        if not target.code:
            target = LanguageCode(self.default_target(source.code))
        route = self.route(LanguagePair(source, target))
        check_glossary_pair(request.glossary, route.source, route.target)
        self._memory(request.memory, route)  # refused here, before a lease
        kind = "identity" if not route.legs else "pivot" if route.pivot else "direct"
        self.registry.metrics.routes.labels(kind=kind).inc()
        return route

    def _memory(self, memory: MemoryChoice, route: Route) -> MemoryLookup | None:
        """The approved translations ``route`` uses: none for the identity (nothing is
        translated); 404 or 400 for a named memory that is unknown or of another pair."""
        if self.memories is None or not route.legs:
            return None
        return self.memories.lookup(memory, route.source, route.target)

    async def _start(self, request: TranslationRequest, plan: RoutePlan) -> DispatchStream:
        """``request`` on ``plan``'s one route: its models leased, its rows queued."""
        route = plan.route
        if not route.legs:
            return DispatchStream(plan, once(lambda: _unchanged(request.texts)))
        started = time.monotonic()
        characters = sum(map(len, request.texts))

        def record(batch: TranslationBatch) -> None:
            self.registry.metrics.on_translation(
                "+".join(route.legs),
                route.source,
                route.target,
                sum(translation.sentences for translation in batch.translations),
                characters,
                time.monotonic() - started,
            )

        resources = AsyncExitStack()
        try:
            leased = await resources.enter_async_context(self.registry.lease(route.legs))
            # Each leg's model translates the leg's pair (a multilingual model serves many).
            first, *rest = (
                translator.for_pair(*pair)
                for translator, pair in zip(leased, route.leg_pairs, strict=True)
            )
            memory = self._memory(request.memory, route)
            items = await first.translate(request, memory, then=rest[0] if rest else None)
        except BaseException:
            await resources.aclose()
            raise
        return DispatchStream(plan, items, resources, record)

    async def _whole(
        self, request: TranslationRequest, texts: list[str], route: Route
    ) -> TranslationBatch:
        """Some of ``request``'s texts on a route planned for them, collected."""
        stream = await self._start(_part(request, texts), RoutePlan(route, None))
        return (await stream.result()).batch

    async def _run_each(self, request: TranslationRequest, plan: RoutePlan) -> TranslationBatch:
        """Each route's texts as one batch, the routes side by side (their models decode
        concurrently), the translations put back in input order."""
        assert plan.routes is not None
        groups: dict[Route, list[int]] = {}
        for index, route in enumerate(plan.routes):
            groups.setdefault(route, []).append(index)
        async with asyncio.TaskGroup() as tasks:  # one refusal cancels the other routes
            running = {
                route: tasks.create_task(
                    self._whole(request, [request.texts[i] for i in indices], route)
                )
                for route, indices in groups.items()
            }
        batches = {route: task.result() for route, task in running.items()}
        translations: list[TextTranslation | None] = [None] * len(request.texts)
        for route, indices in groups.items():
            for index, translation in zip(indices, batches[route].translations, strict=True):
                translations[index] = translation
        return _merged(list(batches.values()), [t for t in translations if t is not None])

    async def _html(self, request: TranslationRequest, route: Route) -> TranslationBatch:
        """Each text is an HTML fragment: its units (service/text/html.py) go to the models in
        request-sized chunks (a fragment's many text nodes do not count as many texts), all
        with the route chosen once for the request (``auto`` detects on the fragments as
        sent)."""
        batches: list[TranslationBatch] = []

        async def translate_chunk(units: list[str]) -> list[str]:
            self.limits.check_request_size(units)
            batch = await self._whole(request, units, route)
            batches.append(batch)
            return [t.text for t in batch.translations]

        async def translate_units(units: list[str]) -> list[str]:
            return await translate_in_chunks(
                units, self.limits.max_texts_per_request, translate_chunk
            )

        translated = [
            await translate_html(text, translate_units, request.markup) for text in request.texts
        ]
        return _merged(batches, [TextTranslation(text, 0, 0) for text in translated])


class DispatchStream:
    """What :meth:`Dispatcher.translate` returns: ``SentenceDone`` items (a streamed request
    on one direct route) and, last, the :class:`DispatchResult`; ``aclose()`` drops
    unfinished rows and releases the models."""

    def __init__(
        self,
        plan: RoutePlan,
        items: TranslationItems,
        resources: AsyncExitStack | None = None,
        on_result: Callable[[TranslationBatch], None] | None = None,
    ) -> None:
        """``on_result``: told of the result (the metrics of the models' translation)."""
        self.plan = plan
        self._items = items
        self._resources = resources or AsyncExitStack()
        self._on_result = on_result

    def __aiter__(self) -> DispatchStream:
        return self

    async def __anext__(self) -> SentenceDone | DispatchResult:
        item = await anext(self._items)
        if isinstance(item, SentenceDone):
            return item
        if self._on_result is not None:
            self._on_result(item)
        return DispatchResult(self.plan, item)

    async def result(self) -> DispatchResult:
        """The last item, every other one read and the stream closed."""
        async with aclosing(self):
            async for item in self:
                if isinstance(item, DispatchResult):
                    return item
        raise RuntimeError("the translation ended without its result")

    async def aclose(self) -> None:
        try:
            await self._items.aclose()
        finally:
            await self._resources.aclose()


async def collect(started: Awaitable[DispatchStream]) -> DispatchResult:
    """The whole result of ``dispatcher.translate(request)``: one awaitable from the request
    to its result, so that a client that hangs up cancels all of it."""
    return await (await started).result()


def document_translator(
    dispatcher: Dispatcher,
    languages: LanguagePair,
    options: DecodingOptions,
    memory: MemoryChoice = PAIR_DEFAULT,
) -> TranslateTexts:
    """Texts of one document → their translations, all by one pair: a named source is
    routed now (an unserved pair is refused before any work); ``auto`` is detected once, on
    the first texts translated, and kept for the rest of the document."""
    pinned: list[LanguagePair] = []
    if not languages.detects:
        route = dispatcher.route(languages)
        pinned.append(LanguagePair.of(route.source, route.target))
    detecting = asyncio.Lock()

    def start(texts: list[str], pair: LanguagePair) -> Awaitable[DispatchStream]:
        return dispatcher.translate(TranslationRequest(texts, pair, options, memory=memory))

    async def start_first(texts: list[str]) -> DispatchStream:
        async with detecting:  # the first chunk here detects; the others wait for its pair
            if pinned:
                return await start(texts, pinned[0])
            stream = await start(texts, languages)
            pinned.append(LanguagePair.of(stream.plan.route.source, stream.plan.route.target))
            return stream

    async def translate_texts(texts: list[str]) -> list[str]:
        stream = await (start(texts, pinned[0]) if pinned else start_first(texts))
        return [translation.text for translation in (await stream.result()).batch.translations]

    return translate_texts


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


def _part(request: TranslationRequest, texts: list[str]) -> TranslationRequest:
    """``request`` for some of its texts (a route's, an HTML chunk's), collected whole: one
    stream is one model's."""
    output = Output.WHOLE if request.output is Output.STREAM else request.output
    return replace(request, texts=texts, format="text", output=output)


def _merged(
    batches: list[TranslationBatch], translations: list[TextTranslation]
) -> TranslationBatch:
    """One batch for the whole request: its translations, the parts' counts added up."""
    return TranslationBatch(
        translations=translations,
        input_tokens=sum(b.input_tokens for b in batches),
        output_tokens=sum(b.output_tokens for b in batches),
        decoded_sentences=sum(b.decoded_sentences for b in batches),
        cached_sentences=sum(b.cached_sentences for b in batches),
        memory_sentences=sum(b.memory_sentences for b in batches),
    )


async def _unchanged(texts: Sequence[str]) -> TranslationBatch:
    """Source and target are the same language: the texts as they are."""
    return _merged([], [TextTranslation(text, 0, 0) for text in texts])
