"""One request, many models: plan it (service/translation/planning.py), lease the models,
translate.

:meth:`Dispatcher.translate` is the one way in. Every API hands it a
:class:`~service.translation.request.TranslationRequest`; it plans the request once (checks
the texts, detects the source, chooses the route, refuses a glossary or memory of another
pair), leases the route's models once and starts the translation once. What comes back is a
:class:`DispatchStream`: a streamed request's sentences as they finish, then, for every
request, the :class:`DispatchResult`. A caller that wants only the result awaits
:func:`collect`, as vLLM's non-streaming server reads ``generate()`` to its last output.

Texts of a list routed apart (``Routing.EACH_TEXT``) run as one batch per route, side by
side. Everything here is the service's own vocabulary (domain errors, no HTTP). Validation that
needs no model (texts, characters, decoding options) runs first, so a bad request never waits
for a model to load.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from contextlib import AsyncExitStack, aclosing
from dataclasses import dataclass, replace

from service.storage.memories import PAIR_DEFAULT, MemoryChoice
from service.text.bulk import TranslateTexts, translate_in_chunks
from service.text.html import translate_html
from service.text.limits import DecodingOptions
from service.text.plans import TextTranslation, TranslationBatch
from service.translation.detection import Detection
from service.translation.languages import LanguagePair
from service.translation.outputs import SentenceDone, TranslationItems, once
from service.translation.planning import RoutePlan, RoutePlanner
from service.translation.request import Output, TranslationRequest
from service.translation.routing import (
    Route,
)


@dataclass(frozen=True)
class DispatchResult:
    plan: RoutePlan
    batch: TranslationBatch  # each text's n-best in its ``alternatives``, when asked for


class Dispatcher:
    def __init__(self, planner: RoutePlanner) -> None:
        """``planner``: where requests go, over the models its registry serves."""
        self.planner = planner
        self.registry = planner.registry
        self.limits = planner.limits

    async def translate(self, request: TranslationRequest) -> DispatchStream:
        """The one way in. Whatever refuses the request (limits, languages, a glossary or
        memory of another pair, queue full, a model not ready) raises here, before the
        stream. The models stay leased until the stream ends or is closed.

        ``Output.STREAM`` on one direct route yields each sentence as it finishes; a pivot
        (or identity) route yields only the result, since a sentence is done when its second
        leg is and the legs run text by text, and so do texts of several routes (one stream
        is one model's) and HTML (its units go in chunks)."""
        plan = await self.planner.plan(request)
        if request.format == "html":
            return DispatchStream(plan, once(lambda: self._html(request, plan)))
        if plan.split:
            return DispatchStream(plan, once(lambda: self._run_each(request, plan)))
        return await self._start(request, plan)

    async def detect(self, texts: str | Sequence[str]) -> list[Detection]:
        """Candidates among the served source languages, best first."""
        return await self.planner.detect(texts)

    def default_target(self, source: str) -> str:
        """The target when the client names none: the only one served from ``source``."""
        return self.planner.default_target(source)

    def route(self, languages: LanguagePair) -> Route:
        """The route of a named source and target (an unserved pair is refused)."""
        return self.planner.route(languages)

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
            memory = (
                plan.memories[route]
                if route in plan.memories
                else self.planner.memory(request.memory, route)
            )
            items = await first.translate(request, memory, then=rest[0] if rest else None)
        except BaseException:
            await resources.aclose()
            raise
        return DispatchStream(plan, items, resources, record)

    async def _whole(
        self, request: TranslationRequest, texts: list[str], route: Route, planned: RoutePlan
    ) -> TranslationBatch:
        """Some of ``request``'s texts on a route ``planned`` for them, collected."""
        part_plan = RoutePlan(route, None, memories=planned.memories)
        stream = await self._start(_part(request, texts), part_plan)
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
                    self._whole(request, [request.texts[i] for i in indices], route, plan)
                )
                for route, indices in groups.items()
            }
        batches = {route: task.result() for route, task in running.items()}
        translations: list[TextTranslation | None] = [None] * len(request.texts)
        for route, indices in groups.items():
            for index, translation in zip(indices, batches[route].translations, strict=True):
                translations[index] = translation
        return _merged(list(batches.values()), [t for t in translations if t is not None])

    async def _html(self, request: TranslationRequest, plan: RoutePlan) -> TranslationBatch:
        """Each text is an HTML fragment: its units (service/text/html.py) go to the models in
        request-sized chunks (a fragment's many text nodes do not count as many texts), all
        with the route chosen once for the request (``auto`` detects on the fragments as
        sent)."""
        batches: list[TranslationBatch] = []

        async def translate_chunk(units: list[str]) -> list[str]:
            self.limits.check_request_size(units)
            batch = await self._whole(request, units, plan.route, plan)
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
