"""What :meth:`Translator.translate` (service/translation/translator.py) gives back, by the
request's output mode: for a stream, a :class:`SentenceDone` per sentence as it finishes, then
the whole batch (:class:`TranslationStream`); otherwise the whole batch as the only item
(:func:`once`), with each text's n-best alternatives when they are asked for
(:func:`with_alternatives`).
"""

from __future__ import annotations

import dataclasses
from collections import deque
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from service.scheduling.sentences import RowResult
from service.scheduling.stream import RowStream
from service.text.pipeline import TextPipeline
from service.text.plans import SentencePlan, TextPlan, TranslationBatch
from service.text.segmenter import join_translations


@dataclass(frozen=True)
class SentenceDone:
    """One finished sentence of a streamed request."""

    text: int  # index of the text in the request
    index: int  # index of the sentence in its text
    sentences: int  # how many sentences that text has
    translation: str  # placeholders and edge tags restored
    tokens: int  # tokens generated for it (0: from the cache or passed through)


class TranslationItems(Protocol):
    """What :meth:`Translator.translate` returns: ``SentenceDone`` items (a stream only), then
    the whole :class:`TranslationBatch`; ``aclose()`` before the end drops the unfinished
    rows from the batch at once."""

    def __aiter__(self) -> AsyncIterator[SentenceDone | TranslationBatch]: ...

    async def __anext__(self) -> SentenceDone | TranslationBatch: ...

    async def aclose(self) -> None: ...


async def once(
    work: Callable[[], Awaitable[TranslationBatch]],
) -> AsyncGenerator[SentenceDone | TranslationBatch, None]:
    """``work``'s batch as the only item (its work starts at the first ``anext``)."""
    yield await work()


class TranslationStream:
    """``async for item in stream``: a :class:`SentenceDone` per sentence in the order they
    finish (those that need no model first), then the whole :class:`TranslationBatch`.
    ``aclose()`` before the end drops the unfinished rows from the batch at once."""

    def __init__(
        self,
        plans: list[TextPlan],
        to_decode: list[SentencePlan],
        rows_done: RowStream,
        finish: Callable[[SentencePlan, Sequence[int]], None],
        assemble: Callable[[], TranslationBatch],
    ) -> None:
        """``finish``: a decoded sentence's tokens written into it (the translator's, which
        caches it too); ``assemble``: the whole batch, once every row is done."""
        self._plans = plans
        self._to_decode = to_decode
        self._rows_done = rows_done
        self._finish = finish
        self._assemble = assemble
        self._position = {
            id(sentence): (text, index)
            for text, plan in enumerate(plans)
            for index, sentence in enumerate(plan.sentences)
        }
        self._known = deque(s for p in plans for s in p.sentences if not s.needs_model)
        self._assembled = False

    def __aiter__(self) -> TranslationStream:
        return self

    async def __anext__(self) -> SentenceDone | TranslationBatch:
        if self._known:
            return self._done(self._known.popleft())
        if self._assembled:
            raise StopAsyncIteration
        try:
            row, result = await anext(self._rows_done)
        except StopAsyncIteration:
            self._assembled = True
            return self._assemble()
        sentence = self._to_decode[row]
        self._finish(sentence, result.tokens)
        return self._done(sentence)

    def _done(self, sentence: SentencePlan) -> SentenceDone:
        text, index = self._position[id(sentence)]
        return SentenceDone(
            text=text,
            index=index,
            sentences=len(self._plans[text].sentences),
            translation=sentence.translation or "",
            tokens=0 if sentence.from_cache else sentence.output_tokens,
        )

    async def aclose(self) -> None:
        await self._rows_done.aclose()


def with_alternatives(
    pipeline: TextPipeline,
    plans: list[TextPlan],
    batch: TranslationBatch,
    decoded: list[SentencePlan],
    results: list[RowResult],
    alternatives: int,
) -> TranslationBatch:
    """``batch`` with up to ``alternatives`` other translations of each text from the
    beam's n-best (LibreTranslate's ``alternatives``): alternative k joins every
    sentence's k-th best hypothesis (its best where the beam has fewer), and repeats and
    copies of the translation are left out, as LibreTranslate does. The caller picks a
    beam of at least ``alternatives + 1``."""
    others = {
        id(sentence): [
            pipeline.hypothesis_text(sentence, hypothesis)
            for hypothesis in result.hypotheses[1 : alternatives + 1]
        ]
        for sentence, result in zip(decoded, results, strict=True)
    }
    translations = []
    for plan, translation in zip(plans, batch.translations, strict=True):
        found: list[str] = []
        for k in range(alternatives):
            parts = [
                others[id(s)][k] if len(others.get(id(s), ())) > k else s.translation or ""
                for s in plan.sentences
            ]
            text = join_translations(plan.text, plan.spans, parts)
            if text != translation.text and text not in found:
                found.append(text)
        translations.append(dataclasses.replace(translation, alternatives=tuple(found)))
    return dataclasses.replace(batch, translations=translations)
