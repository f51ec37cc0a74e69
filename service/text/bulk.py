"""Many texts from one document (an HTML fragment's units, a file's lines or entries) through
the translator in request-sized chunks.

A document is one client request but may hold hundreds of texts: more than
``MT_MAX_TEXTS_PER_REQUEST`` and, in sentences, more than the queue takes at once. So its
texts go in chunks of at most ``max_texts_per_request`` texts, at most ``MAX_CHUNKS_IN_FLIGHT``
chunks at a time: enough to keep the batch full while earlier chunks decode, few enough that
one file does not fill the queue and push other clients into 429s. A chunk that fails fails
the document (the others are cancelled, which drops their rows).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence

MAX_CHUNKS_IN_FLIGHT = 2

# Texts in, their translations out, in order: how documents (HTML, files) reach the
# translator without knowing which model or route serves them.
TranslateTexts = Callable[[list[str]], Awaitable[list[str]]]


async def translate_in_chunks(
    texts: Sequence[str], chunk_size: int, translate_chunk: TranslateTexts
) -> list[str]:
    """``translate_chunk`` over ``texts`` in chunks of ``chunk_size``; results in order."""
    chunks = [list(texts[start : start + chunk_size]) for start in range(0, len(texts), chunk_size)]
    return await translate_chunks(chunks, translate_chunk, MAX_CHUNKS_IN_FLIGHT)


async def translate_chunks(
    chunks: Sequence[list[str]], translate_chunk: TranslateTexts, in_flight: int
) -> list[str]:
    """``translate_chunk`` over ``chunks``, at most ``in_flight`` at a time; the texts' results
    in order. The first chunk to fail cancels the others and raises its error."""
    results: list[list[str]] = [[] for _ in chunks]
    gate = asyncio.Semaphore(in_flight)

    async def run(index: int) -> None:
        async with gate:
            results[index] = await translate_chunk(chunks[index])

    try:
        async with asyncio.TaskGroup() as group:
            for index in range(len(chunks)):
                group.create_task(run(index))
    except BaseExceptionGroup as failed:
        # The first refusal (queue full, a text over a limit …) is what the client hears.
        raise failed.exceptions[0] from None
    return [text for chunk in results for text in chunk]
