"""Document rows beside interactive ones: they wait for a boundary without interactive rows,
or until they have waited long enough, and a lone paragraph runs whole."""

from __future__ import annotations

import asyncio

import pytest

from tests.scheduling.batcher_helpers import FakeEngine, GatedEngine, sentence, wait_until


async def _documents_beside_a_running_request(make_batcher, **limits):
    """One interactive sentence running, three one-row document requests queued, then an
    interactive newcomer queued last; every result checked. Returns the engine."""
    engine = GatedEngine()
    batcher = make_batcher(engine, background_max_rows=2, **limits)
    running = asyncio.ensure_future(batcher.submit([sentence(30)]))
    await wait_until(engine.waiting.is_set, "first step waiting")
    documents = [
        asyncio.ensure_future(batcher.submit([sentence(20, first=100 + 30 * i)], background=True))
        for i in range(3)
    ]
    await wait_until(lambda: batcher.queue_depth == 3, "three document sentences queued")
    interactive = asyncio.ensure_future(batcher.submit([sentence(4, first=400)]))
    await wait_until(lambda: batcher.queue_depth == 4, "an interactive sentence queued last")
    engine.allow(10**4)
    results = await asyncio.gather(running, interactive, *documents)
    expected = [sentence(30), sentence(4, first=400)] + [
        sentence(20, first=100 + 30 * i) for i in range(3)
    ]
    assert [r[0].tokens for r in results] == [FakeEngine.expected(s.src_ids) for s in expected]
    return engine


@pytest.mark.anyio
async def test_document_rows_wait_for_a_boundary_without_interactive_rows(make_batcher):
    """The interactive newcomer joins first though it came last; the document rows join only
    once no interactive row runs, two rows at a time."""
    engine = await _documents_beside_a_running_request(make_batcher, background_max_wait_ms=60_000)
    running_alone = 29  # the running sentence's 29 tokens
    assert engine.rows_per_step[:2] == [1, 2]
    assert max(engine.rows_per_step[:running_alone]) == 2  # no document row beside them
    assert engine.rows_per_step[running_alone] == 2  # then two document rows, not three
    assert max(engine.rows_per_step) == 2


@pytest.mark.anyio
async def test_document_rows_that_waited_long_enough_join_beside_interactive_ones(make_batcher):
    engine = await _documents_beside_a_running_request(make_batcher, background_max_wait_ms=0)
    # the interactive newcomer alone first, then two document rows beside both, never three
    assert engine.rows_per_step[:3] == [1, 2, 4]
    assert max(engine.rows_per_step) == 4


@pytest.mark.anyio
async def test_a_lone_document_paragraph_runs_whatever_the_background_row_limit(make_batcher):
    engine = FakeEngine()
    batcher = make_batcher(engine, background_max_rows=1)
    rows = [sentence(5, first=10 * i + 1) for i in range(3)]  # one unit of three rows
    results = await batcher.submit(rows, background=True)
    assert [r.tokens for r in results] == [FakeEngine.expected(row.src_ids) for row in rows]
    assert engine.rows_per_step[0] == 3  # the whole paragraph joined an empty batch
