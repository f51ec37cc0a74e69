"""Texts in, texts out, asynchronously: the text pipeline around the continuous batcher.

The synchronous text work (limits, sentences, placeholders, tokens, joining) is
service/text/pipeline.py; this module adds what only a server needs: a translation cache,
tokenizing large requests off the event loop, and awaiting the batcher, which decodes every
sentence of the request at once (one row per sentence and beam). :meth:`Translator.translate`
is the one way in; the request's output mode says whether the sentences come back all
together, each as soon as it finishes (for server-sent events), or with their n-best
(service/translation/outputs.py).

Refusals are the pipeline's domain errors (``InputTooLarge``, ``InvalidInput``) and the
batcher's (queue full, shutting down, timeout); the web layer maps them to statuses.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import functools
import time
from collections import OrderedDict
from collections.abc import Sequence

from service.runtime.types import DecodeRequest
from service.scheduling.row_batcher import RowBatcher
from service.scheduling.sentences import RowResult
from service.text.limits import DecodingOptions, TextLimits
from service.text.pipeline import TextPipeline
from service.text.plans import MemoryLookup, SentencePlan, TextPlan, TranslationBatch
from service.text.tokenizer import Tokenizer
from service.translation.languages import normalise_language_code
from service.translation.outputs import TranslationItems, TranslationStream, once, with_alternatives
from service.translation.request import Output, TranslationRequest

# Tokenizing is quick, but a request at the limits (64 texts x 5000 characters) would hold
# the event loop for a noticeable time: such requests tokenize in a worker thread.
_TOKENIZE_IN_THREAD_CHARS = 20_000


class TranslationCache:
    """LRU of sentence translations keyed by the masked sentence and the decoding options.

    Correct because decoding is deterministic and does not depend on the batch
    (docs/design.md, decision 6). Used from the event loop only, so it needs no lock.
    """

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._entries: OrderedDict[tuple, tuple[str, int]] = OrderedDict()

    def get(self, key: tuple) -> tuple[str, int] | None:
        entry = self._entries.get(key)
        if entry is not None:
            self._entries.move_to_end(key)
        return entry

    def put(self, key: tuple, value: tuple[str, int]) -> None:
        self._entries[key] = value
        self._entries.move_to_end(key)
        while len(self._entries) > self.capacity:
            self._entries.popitem(last=False)


def _cache_key(masked: str, options: DecodingOptions, scope: tuple = ()) -> tuple:
    return (masked, options.beam_size, options.max_new_tokens, options.length_penalty, scope)


class Translator:
    def __init__(
        self,
        tokenizer: Tokenizer,
        batcher: RowBatcher,
        limits: TextLimits,
        source_lang: str = "en",
        model_positions: int | None = None,
    ) -> None:
        """``model_positions``: the model's position table size (see TextPipeline)."""
        self.pipeline = TextPipeline(tokenizer, limits, source_lang, model_positions)
        self.tokenizer = tokenizer
        self.metrics = batcher.metrics
        self.batcher = batcher
        self.limits = limits
        self.source_lang = source_lang
        cache_size = limits.translation_cache_size
        self.cache = TranslationCache(cache_size) if cache_size > 0 else None
        # A multilingual model (service/text/tokenizer.py, NllbTokenizer): canonical code ->
        # the tokenizer's code; each pair is served by a view (for_pair).
        self._codes = {normalise_language_code(code): code for code in tokenizer.languages}
        self._pipelines: dict[str, TextPipeline] = {}  # per source language, shared by views
        self.forced_prefix: tuple[int, ...] = ()  # the target's code, generated first
        self.cache_scope: tuple[str, ...] = ()  # the pair, in a multilingual model's cache

    def for_pair(self, source: str, target: str) -> Translator:
        """This model translating ``source``→``target`` (canonical codes): itself for a model
        of one pair; for a multilingual model, a view sharing its batcher and cache, whose
        pipeline splits sentences by the source's rules and puts the source's code before
        each source, and whose rows generate the target's code first."""
        if not self._codes:
            return self
        view = copy.copy(self)
        view.source_lang = source
        view.pipeline = self._pipelines.get(source) or self._pipelines.setdefault(
            source,
            TextPipeline(
                self.tokenizer.for_source(self._codes[source]),
                self.limits,
                source,
                self.pipeline.max_input_tokens,
            ),
        )
        view.forced_prefix = self.tokenizer.target_prefix(self._codes[target])
        view.cache_scope = (source, target)
        return view

    def _cached(self, masked: str, options: DecodingOptions) -> tuple[str, int] | None:
        assert self.cache is not None
        hit = self.cache.get(_cache_key(masked, options, self.cache_scope))
        if hit is not None:
            self.metrics.cache_hits.inc()
        return hit

    async def translate(
        self,
        request: TranslationRequest,
        memory: MemoryLookup | None = None,
        then: Translator | None = None,
    ) -> TranslationItems:
        """The one way in: ``request.texts`` through this model, as ``request.output`` asks.

        Everything that can refuse the request (the pipeline's ``TextError``s for the limits;
        for a stream, queue full) raises here, before the first item. The items: for a
        stream, a :class:`SentenceDone` per sentence as it finishes; then, always, the
        :class:`TranslationBatch` (with each text's n-best alternatives when asked for).
        ``then``: a second model that translates this one's output sentence by sentence (a
        pivot, X→en→Y), whole only: its sentences finish with the second leg, and its two
        beams have no single n-best. ``request.glossary``: terms enforced on this model's
        source; on a pivot they cross the second leg as symbols too. ``memory``: approved
        translations for the route's pair, written without either model."""
        # One MT_REQUEST_TIMEOUT_S for the request, however many legs it takes.
        deadline = time.monotonic() + self.limits.request_timeout_s
        output = request.output if then is None else Output.WHOLE
        options = request.options
        # The cache keeps no n-best: alternatives decode every sentence.
        plans = await self._plan(request, output is not Output.ALTERNATIVES, memory)
        if output is Output.STREAM:
            to_decode, rows = self._rows(plans, options)
            await self.batcher.until_live()
            rows_done = self.batcher.submit_as_completed(
                rows, timeout_s=self.limits.request_timeout_s, background=options.background
            )
            await rows_done.started()  # an engine core's refusal is the response's status
            finish = functools.partial(self._finish, options=options)
            assemble = functools.partial(self.pipeline.assemble, plans, decoded=len(to_decode))
            return TranslationStream(plans, to_decode, rows_done, finish, assemble)
        alternatives = request.alternatives if output is Output.ALTERNATIVES else 0
        return once(lambda: self._whole(plans, options, deadline, then, alternatives))

    async def _whole(
        self,
        plans: list[TextPlan],
        options: DecodingOptions,
        deadline: float,
        then: Translator | None,
        alternatives: int,
    ) -> TranslationBatch:
        """Decode ``plans`` at once, then, on a pivot, their second leg."""
        to_decode, results = await self._decode(plans, options, deadline)
        batch = self.pipeline.assemble(plans, decoded=len(to_decode))
        if alternatives:
            return with_alternatives(self.pipeline, plans, batch, to_decode, results, alternatives)
        if then is None:
            return batch
        second_leg = await then._continue(plans, options, deadline)
        return dataclasses.replace(
            second_leg,
            input_tokens=batch.input_tokens,
            output_tokens=batch.output_tokens + second_leg.output_tokens,
            decoded_sentences=batch.decoded_sentences + second_leg.decoded_sentences,
            cached_sentences=batch.cached_sentences + second_leg.cached_sentences,
        )

    async def _continue(
        self, plans: list[TextPlan], options: DecodingOptions, deadline: float
    ) -> TranslationBatch:
        """The second leg: every sentence the first model translated becomes this model's
        source (in place, so the texts keep their sentence structure and whitespace)."""
        cached = self._cached if self.cache is not None else None
        for plan in plans:
            plan.sentences = [
                self.pipeline.continue_sentence(sentence, options, cached)
                if sentence.masked_translation is not None
                else sentence
                for sentence in plan.sentences
            ]
        to_decode, _ = await self._decode(plans, options, deadline)
        return self.pipeline.assemble(plans, decoded=len(to_decode))

    async def _plan(
        self, request: TranslationRequest, use_cache: bool, memory: MemoryLookup | None
    ) -> list[TextPlan]:
        # The request's size is checked once, by the dispatcher, before any model is leased.
        cached = self._cached if self.cache is not None and use_cache else None
        plan = functools.partial(
            self.pipeline.plan,
            request.texts,
            request.options,
            cached,
            request.glossary,
            memory,
            request.handling,
        )
        if sum(map(len, request.texts)) > _TOKENIZE_IN_THREAD_CHARS:
            plans = await asyncio.to_thread(plan)
        else:
            plans = plan()
        if memory is not None:
            self.metrics.memory_hits.inc(sum(s.from_memory for p in plans for s in p.sentences))
        return plans

    async def _decode(
        self, plans: list[TextPlan], options: DecodingOptions, deadline: float
    ) -> tuple[list[SentencePlan], list[RowResult]]:
        """Decode the sentences of ``plans`` that need the model, all at once, before
        ``deadline`` (``time.monotonic``; ``TimeoutError`` past it): those sentences, finished,
        and their rows' results."""
        to_decode, rows = self._rows(plans, options)
        timeout_s = max(0.0, deadline - time.monotonic())
        results = await self.batcher.submit(
            rows, timeout_s=timeout_s, background=options.background
        )
        for sentence, result in zip(to_decode, results, strict=True):
            self._finish(sentence, result.tokens, options)
        return to_decode, results

    def _rows(
        self, plans: list[TextPlan], options: DecodingOptions
    ) -> tuple[list[SentencePlan], list[DecodeRequest]]:
        """The sentences of ``plans`` that need the model, and their rows."""
        to_decode = [s for plan in plans for s in plan.sentences if s.needs_model]
        rows = [
            DecodeRequest(
                src_ids=sentence.src_ids,
                beam_size=options.beam_size,
                # generate's count, which the forced ids are part of
                max_new_tokens=sentence.max_new_tokens + len(self.forced_prefix),
                length_penalty=options.length_penalty,
                copy_tokens=sentence.copy_tokens,
                forced_prefix=self.forced_prefix,
            )
            for sentence in to_decode
        ]
        return to_decode, rows

    def _finish(
        self, sentence: SentencePlan, tokens: Sequence[int], options: DecodingOptions
    ) -> None:
        self.pipeline.finish(sentence, tokens)
        if self.cache is not None:
            assert sentence.masked_translation is not None
            self.cache.put(
                _cache_key(sentence.masked, options, self.cache_scope),
                (sentence.masked_translation, sentence.output_tokens),
            )
