"""Placeholder-constrained decoding: symbols come out exactly as often as the source has them.

Search-level tests on synthetic logits (eos ban, forcing at the end, beam reordering), and
engine-level tests on the tiny exported model of tests/service_fixtures.py, whose random
weights emit placeholder symbols freely when unconstrained.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from service.runtime.constraints import CopyConstraint
from service.runtime.engine import Engine
from service.runtime.model_io import StepOutput
from service.runtime.search import BeamSearch, GreedySearch
from service.text.pipeline import copy_tokens_for
from service.text.placeholders import PLACEHOLDER_SYMBOLS
from service.text.protection import placeholder_token_ids
from service.text.tokenizer import Tokenizer
from tests.head_reference import advance_on_logits, head_from_logits
from tests.service_fixtures import VOCAB_SIZE, tiny_model

EOS, PAD, V = 0, 9, 10


def drive(search, logits_for_step) -> list[int]:
    while not search.done:
        advance_on_logits(search, logits_for_step(search.steps), PAD)
    return search.result()


def test_greedy_emits_owed_symbols_when_it_would_stop():
    # eos is the favourite, then symbol 6 (not in the source), then word 7; symbol 5 is owed
    # twice: instead of rambling on with word 7, the row pays its symbols, then stops.
    logits = np.full((1, V), -5.0, dtype=np.float32)
    logits[0, [EOS, 6, 7, 5]] = [10.0, 9.0, 5.0, 1.0]
    search = GreedySearch(10, EOS, PAD, copy_tokens={5: 2, 6: 0})
    assert drive(search, lambda step: logits) == [5, 5]
    assert search.steps == 3


def test_greedy_bans_eos_while_owed_and_forces_at_the_end():
    # Word 7 is the favourite, eos next: eos stays banned while 5 is owed, and the symbols are
    # forced out when the steps left equal the symbols owed.
    logits = np.full((1, V), -5.0, dtype=np.float32)
    logits[0, [7, EOS, 6, 5]] = [10.0, 9.0, 8.0, 1.0]
    search = GreedySearch(10, EOS, PAD, copy_tokens={5: 2, 6: 0})
    assert drive(search, lambda step: logits) == [7] * 8 + [5, 5]
    # Symbol more likely than the words: it comes out, then eos is allowed again.
    logits[0, 5] = 11.0
    search = GreedySearch(10, EOS, PAD, copy_tokens={5: 2, 6: 0})
    assert drive(search, lambda step: logits) == [5, 5, 7, 7, 7, 7, 7, 7, 7, 7]


def test_greedy_more_symbols_than_steps_respects_max_new_tokens():
    logits = np.zeros((1, V), dtype=np.float32)
    search = GreedySearch(2, EOS, PAD, copy_tokens={3: 2, 4: 1})
    out = drive(search, lambda step: logits)
    assert len(out) == 2 and set(out) <= {3, 4} and Counter(out)[4] <= 1


def test_beam_rows_keep_their_own_counts():
    rng = np.random.default_rng(0)
    for trial in range(20):
        copy = {3: 1, 4: 2, 5: 0}
        table = rng.normal(size=(12, 4, V)).astype(np.float32)
        table[:, :, EOS] += 2.0  # eos is tempting
        search = BeamSearch(4, 12, EOS, PAD, copy_tokens=copy)
        out = drive(search, table.__getitem__)
        counts = Counter(out)
        assert {token: counts[token] for token in copy} == copy, (trial, out)
        assert len(out) <= 12


def test_argmax_before_bans_breaks_ties_by_the_lower_id():
    """The vectorised argmax over the head's top 1 and the watched ids against a per-row sort
    (highest log-prob, then lowest id), on rows full of ties and duplicated ids."""
    rng = np.random.default_rng(0)
    constraint = CopyConstraint({5: 1, 6: 2}, rows=64, eos_id=EOS, pad_id=PAD)
    top_score = rng.choice([-1.0, -2.0, -np.inf], size=64).astype(np.float32)
    top_id = rng.integers(0, V, size=64)
    watch_ids = rng.integers(0, V, size=(64, 5))
    watch_log_probs = rng.choice([-1.0, -2.0, -3.0], size=(64, 5)).astype(np.float32)
    head = StepOutput(top_score[:, None], top_id[:, None], watch_log_probs, watch_ids)
    got = constraint._unbanned_best(head, top_score, top_id)
    for row in range(64):
        ids = np.concatenate([[top_id[row]], watch_ids[row]])
        scores = np.concatenate([[top_score[row]], watch_log_probs[row]])
        expected = ids[np.lexsort((ids, -scores))[0]]
        assert got[row] == expected
        one_row = constraint._unbanned_best(
            head.rows(row, row + 1), top_score[row : row + 1], top_id[row : row + 1]
        )
        assert one_row.tolist() == [expected]  # the one-row (greedy) path


def test_bans_follow_the_rows_through_reorders_and_emissions():
    constraint = CopyConstraint({5: 1, 6: 2}, rows=2, eos_id=EOS, pad_id=PAD)
    assert constraint.bans().tolist() == [[PAD, PAD, EOS], [PAD, PAD, EOS]]
    constraint.advance(np.array([5, 7]), np.array([0, 1]))  # row 0 pays its 5
    assert constraint.bans().tolist() == [[5, PAD, EOS], [PAD, PAD, EOS]]
    constraint.advance(np.array([7, 6]), np.array([1, 0]))  # rows swap, then row 1 emits a 6
    assert constraint.bans().tolist() == [[PAD, PAD, EOS], [5, PAD, EOS]]
    constraint.advance(np.array([6, 6]), np.array([1, 1]))  # both continue row 1
    assert constraint.bans().tolist() == [[5, 6, PAD], [5, 6, PAD]]


def test_a_reorder_of_rows_that_owe_alike_keeps_the_bans():
    constraint = CopyConstraint({5: 0, 6: 0}, rows=3, eos_id=EOS, pad_id=PAD)
    bans = constraint.bans()
    constraint.advance(np.array([7, 8, 9]), np.array([2, 0, 0]))  # beams reorder, owe nothing
    assert constraint.bans() is bans  # not rebuilt: nothing changed
    assert bans.tolist() == [[5, 6, PAD]] * 3
    constraint = CopyConstraint({5: 1, 6: 0}, rows=2, eos_id=EOS, pad_id=PAD)
    constraint.advance(np.array([5, 7]), np.array([0, 1]))  # row 0 pays its 5
    bans = constraint.bans()
    constraint.advance(np.array([7, 7]), np.array([1, 0]))  # rows that differ swap
    assert constraint.bans() is not bans
    assert constraint.bans().tolist() == [[PAD, 6, EOS], [5, 6, PAD]]


def test_no_constraint_is_unchanged():
    rng = np.random.default_rng(1)
    table = rng.normal(size=(8, 3, V)).astype(np.float32)
    plain = drive(BeamSearch(3, 8, EOS, PAD), lambda step: table[step])
    empty = drive(BeamSearch(3, 8, EOS, PAD, copy_tokens={}), lambda step: table[step])
    assert plain == empty


# --- the tiny exported model -----------------------------------------------------------------


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    return Engine.from_dir(tiny_model(tmp_path_factory), provider="cpu", intra_op_threads=1)


@pytest.fixture(scope="module")
def symbol_ids(engine):
    return placeholder_token_ids(Tokenizer.from_dir(engine.model_dir))


def sources_with_symbols(symbol_ids, count=6, seed=0):
    """Random word ids with one to three symbols (some repeated) spliced in, eos last."""
    rng = np.random.default_rng(seed)
    symbols = sorted(symbol_ids)
    words = [i for i in range(34, VOCAB_SIZE - 1)]
    sources = []
    for _ in range(count):
        src = [int(t) for t in rng.choice(words, size=int(rng.integers(4, 9)))]
        chosen = [int(t) for t in rng.choice(symbols[:4], size=int(rng.integers(1, 4)))]
        for symbol in chosen:
            src.insert(int(rng.integers(0, len(src) + 1)), symbol)
        sources.append(src + [0])
    return sources


def test_tokenizer_symbol_ids(engine, symbol_ids):
    assert symbol_ids == frozenset(range(2, 2 + len(PLACEHOLDER_SYMBOLS)))
    src = Tokenizer.from_dir(engine.model_dir).encode_one(
        f"Save {PLACEHOLDER_SYMBOLS[0]} to {PLACEHOLDER_SYMBOLS[1]}"
    )
    copy = copy_tokens_for(src, symbol_ids)
    assert copy[2] == 1 and copy[3] == 1 and sum(copy.values()) == 2


@pytest.mark.parametrize("beam_size", [1, 3])
def test_engine_outputs_carry_exactly_the_source_symbols(engine, symbol_ids, beam_size):
    sources = sources_with_symbols(symbol_ids)
    max_new = 16
    copies = [copy_tokens_for(src, symbol_ids) for src in sources]
    plain = engine.translate_ids(sources, beam_size=beam_size, max_new_tokens=max_new)
    constrained = engine.translate_ids(
        sources, beam_size=beam_size, max_new_tokens=max_new, copy_tokens=copies
    )
    broken = 0
    for src, copy, before, after in zip(sources, copies, plain, constrained, strict=True):
        wanted = Counter(t for t in src if t in symbol_ids)
        assert Counter(t for t in after if t in symbol_ids) == wanted
        assert set(copy) == symbol_ids and len(after) <= max_new
        broken += Counter(t for t in before if t in symbol_ids) != wanted
    assert broken > 0  # the unconstrained random model does lose or invent symbols


def test_engine_tight_max_new_tokens_forces_symbols(engine, symbol_ids):
    src = [40, 2, 50, 3, 60, 2, 0]
    copy = copy_tokens_for(src, symbol_ids)
    for beam_size in (1, 2):
        for max_new in (3, 4):
            (out,) = engine.translate_ids(
                [src], beam_size=beam_size, max_new_tokens=max_new, copy_tokens=[copy]
            )
            assert len(out) <= max_new
            assert Counter(t for t in out if t in symbol_ids) == {2: 2, 3: 1}


def test_engine_without_constraint_is_unchanged(engine, symbol_ids):
    sources = [src for src in sources_with_symbols(symbol_ids, count=4, seed=2)]
    for beam_size in (1, 3):
        plain = engine.translate_ids(sources, beam_size=beam_size, max_new_tokens=12)
        nones = engine.translate_ids(
            sources, beam_size=beam_size, max_new_tokens=12, copy_tokens=[None] * len(sources)
        )
        assert plain == nones


def test_engine_sources_without_symbols_ban_invented_ones(engine, symbol_ids):
    rng = np.random.default_rng(3)
    sources = [[int(t) for t in rng.integers(34, VOCAB_SIZE - 1, size=6)] + [0] for _ in range(6)]
    copies = [copy_tokens_for(src, symbol_ids) for src in sources]
    plain = engine.translate_ids(sources, beam_size=1, max_new_tokens=12)
    constrained = engine.translate_ids(sources, beam_size=1, max_new_tokens=12, copy_tokens=copies)
    for before, after in zip(plain, constrained, strict=True):
        assert not symbol_ids & set(after)
        if not symbol_ids & set(before):  # nothing to ban: the same translation
            assert before == after


@pytest.mark.parametrize("forced_prefix", [(), (8,), (8, 7)])
def test_greedy_take_is_advance_whenever_it_follows_the_head(forced_prefix):
    # The group's fast path (service/runtime/groups.py): while a greedy search follows the
    # head, ``take(head.top_ids[0, 0])`` must do exactly what ``advance(head)`` does, and
    # while it does not (a forced id due, a symbol owed) the group calls ``advance``. Two
    # searches, one driven each way over the same random logits, stay identical step by step.
    rng = np.random.default_rng(7)
    followed = 0
    for _ in range(40):
        copy_tokens = {5: int(rng.integers(0, 3)), 6: int(rng.integers(0, 2))}
        plain = GreedySearch(12, EOS, PAD, copy_tokens=copy_tokens, forced_prefix=forced_prefix)
        fast = GreedySearch(12, EOS, PAD, copy_tokens=copy_tokens, forced_prefix=forced_prefix)
        while not plain.done:
            logits = rng.normal(size=(1, V)).astype(np.float32) * 3
            logits[0, EOS] -= 2.0  # stop less often: longer runs, more symbols
            head = head_from_logits(
                logits, 1, [PAD], extra_bans=plain.bans(), watch_ids=plain.watch_ids()
            )
            tokens, _ = plain.advance(head)
            if fast.follows_head():
                followed += 1
                fast.take(int(head.top_ids[0, 0]))
            else:
                fast.advance(head)
            assert fast.tokens == plain.tokens and fast.steps == plain.steps
            assert fast.done == plain.done
            assert np.array_equal(fast.constraint.remaining, plain.constraint.remaining)
            assert fast.constraint.owes == plain.constraint.owes
        assert (
            Counter(t for t in plain.result() if t in copy_tokens)
            == Counter({t: n for t, n in copy_tokens.items() if n})
            or plain.steps == 12
        )
    assert followed > 0


def test_constraint_owes_follows_its_counts():
    constraint = CopyConstraint({5: 1, 6: 0}, rows=2, eos_id=EOS, pad_id=PAD)
    assert constraint.owes
    constraint.advance(np.array([5, 7]), np.array([0, 1]))  # row 0 pays; row 1 still owes
    assert constraint.owes
    constraint.advance(np.array([7, 5]), np.array([0, 1]))  # row 1 pays
    assert not constraint.owes
    constraint.advance(np.array([7, 7]), np.array([1, 1]))  # reorder: nobody owes
    assert not constraint.owes
