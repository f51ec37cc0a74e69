"""The vectorised beam step (``advance_beams``) against the per-request search it replaced.

``per_request_advance`` is the per-request ``BeamSearch.advance`` as it was before the step
over a whole group, kept here verbatim as the reference: driven over the same random logits,
one search advanced alone by it and one advanced by ``advance_beams`` beside other requests
must agree at every step (tokens, parents, running beams and scores, finished hypotheses,
stop, placeholder counts).
"""

from __future__ import annotations

import numpy as np
import pytest

from service.runtime.constraints import top_k_descending
from service.runtime.model_io import StepOutput
from service.runtime.search import BeamSearch, advance_beams
from service.runtime.stepping import place_children
from tests.head_reference import head_from_logits

EOS, PAD, V = 0, 9, 12


def per_request_advance(self: BeamSearch, head: StepOutput) -> tuple[np.ndarray, np.ndarray]:
    num_beams = self.beam_size  # num_rows: its rows in the batch (one before the first step)
    row_scores, row_ids = self._candidates(head)
    flat_scores = (row_scores + self.running_scores[:, None]).reshape(-1).astype(np.float32)
    flat_beam = np.repeat(np.arange(num_beams), row_ids.shape[1])
    flat_token = row_ids.reshape(-1)
    chosen = top_k_descending(flat_scores, 2 * num_beams, flat_beam * (1 << 32) + flat_token)
    top_scores, top_beam, top_token = flat_scores[chosen], flat_beam[chosen], flat_token[chosen]
    self.steps += 1
    length = self.steps
    ends = (top_token == self.eos_id) | (length == self.max_new_tokens)
    ends &= np.isfinite(top_scores)
    normaliser = length**self.length_penalty
    for rank in range(num_beams):
        if ends[rank]:
            hypothesis = list(self.running_tokens[top_beam[rank]])
            if top_token[rank] != self.eos_id:
                hypothesis.append(int(top_token[rank]))
            self.finished.append((float(top_scores[rank]) / normaliser, hypothesis))
    self.finished.sort(key=lambda item: item[0], reverse=True)
    del self.finished[num_beams:]
    open_scores = top_scores - np.float32(1e9) * ends.astype(np.float32)
    keep_rank = top_k_descending(open_scores, num_beams)
    keep_beam, keep_token = top_beam[keep_rank], top_token[keep_rank]
    self.running_tokens = [
        self.running_tokens[beam] + [int(token)]
        for beam, token in zip(keep_beam, keep_token, strict=True)
    ]
    self.running_scores = open_scores[keep_rank].astype(np.float32)
    if self.constraint is not None:
        self.constraint.advance(keep_token, keep_beam)
    best_running = float(self.running_scores[0]) / normaliser
    worst_finished = self.finished[-1][0] if len(self.finished) == num_beams else -1e9
    self.done = not best_running > worst_finished or length >= self.max_new_tokens
    return keep_token.astype(np.int64), keep_beam.astype(np.int64)


def make_pair(rng, beams: int) -> tuple[BeamSearch, BeamSearch]:
    """Two identical searches of random options: length penalty, limit, placeholder counts,
    forced prefix."""
    options = dict(
        max_new_tokens=int(rng.integers(2, 14)),
        eos_id=EOS,
        pad_id=PAD,
        length_penalty=float(rng.choice([0.6, 1.0, 1.3, 2.0])),
        copy_tokens={5: int(rng.integers(0, 3)), 6: int(rng.integers(0, 2))}
        if rng.random() < 0.5
        else None,
        forced_prefix=tuple(int(t) for t in rng.choice([7, 8], size=int(rng.integers(0, 3)))),
    )
    return BeamSearch(beams, **options), BeamSearch(beams, **options)


def joined_head(heads: list[StepOutput]) -> StepOutput:
    """Requests' heads stacked as one group's (watched columns padded with -inf/pad)."""
    width = max(head.watch_ids.shape[1] for head in heads)

    def pad(array, value):
        return np.pad(array, ((0, 0), (0, width - array.shape[1])), constant_values=value)

    return StepOutput(
        np.concatenate([head.top_log_probs for head in heads]),
        np.concatenate([head.top_ids for head in heads]),
        np.concatenate([pad(head.watch_log_probs, -np.inf) for head in heads]),
        np.concatenate([pad(head.watch_ids, PAD) for head in heads]),
    )


def _rows(head: StepOutput, order: np.ndarray) -> StepOutput:
    arrays = (head.top_log_probs, head.top_ids, head.watch_log_probs, head.watch_ids)
    return StepOutput(*(array[order] for array in arrays))


def assert_same(alone: BeamSearch, batched: BeamSearch) -> None:
    assert batched.steps == alone.steps and batched.done == alone.done
    assert batched.running_tokens == alone.running_tokens
    assert np.array_equal(batched.running_scores, alone.running_scores)
    assert batched.finished == alone.finished
    if alone.constraint is not None:
        assert np.array_equal(batched.constraint.remaining, alone.constraint.remaining)


@pytest.mark.parametrize("beams", [2, 3, 4])
def test_the_group_step_equals_each_request_advanced_alone(beams):
    rng = np.random.default_rng(beams)
    finished_at: set[int] = set()
    for trial in range(25):
        pairs = [make_pair(rng, beams) for _ in range(int(rng.integers(1, 6)))]
        # Requests join at different steps: a late one starts after the others' first steps.
        join_at = [int(rng.integers(0, 3)) for _ in pairs]
        step = 0
        while not all(alone.done for alone, _ in pairs):
            running = [
                (alone, batched)
                for (alone, batched), start in zip(pairs, join_at, strict=True)
                if start <= step and not alone.done
            ]
            step += 1
            if not running:
                continue
            heads = []
            for alone, _ in running:
                # Coarse logits: ties between candidates, within and across beams.
                logits = rng.integers(-4, 4, size=(beams, V)).astype(np.float32) / 2
                logits[:, EOS] -= float(rng.integers(0, 3))
                heads.append(
                    head_from_logits(
                        logits, 2 * beams, [PAD], alone.bans(), watch_ids=alone.watch_ids()
                    )
                )
            expected = [
                per_request_advance(alone, head)
                for (alone, _), head in zip(running, heads, strict=True)
            ]
            # The group keeps each request's beams in rows of its own choosing (the fewest
            # cache copies): here a random order per request, which the step must follow.
            beam_rows = np.stack([rng.permutation(beams) for _ in running])
            beam_rows += beams * np.arange(len(running))[:, None]
            # physical row beam_rows[i, k] holds beam k of request i
            physical = _rows(joined_head(heads), np.argsort(beam_rows.reshape(-1)))
            tokens, parents = advance_beams(
                [batched for _, batched in running], physical, beam_rows
            )
            for index, (alone, batched) in enumerate(running):
                assert tokens[index].tolist() == expected[index][0].tolist(), trial
                assert parents[index].tolist() == expected[index][1].tolist(), trial
                assert_same(alone, batched)
                if alone.done:
                    finished_at.add(alone.steps)
        for alone, batched in pairs:
            assert batched.result() == alone.result()
            assert batched.hypotheses() == alone.hypotheses()
    assert len(finished_at) > 3  # requests finished at many different steps


def test_advance_of_one_search_is_the_group_step_of_one():
    rng = np.random.default_rng(11)
    alone, batched = make_pair(rng, 3)
    while not alone.done:
        logits = rng.normal(size=(3, V)).astype(np.float32)
        head = head_from_logits(logits, 6, [PAD], alone.bans(), watch_ids=alone.watch_ids())
        expected = per_request_advance(alone, head)
        tokens, parents = batched.advance(head)
        assert tokens.tolist() == expected[0].tolist()
        assert parents.tolist() == expected[1].tolist()
        assert_same(alone, batched)


def test_next_beams_stay_in_their_parents_rows_and_copy_only_into_dead_beams_rows():
    # parents' rows per next beam: row 0 has three children, row 2 one, rows 1 and 3 none
    placed = place_children(np.array([[0, 0, 2, 0], [3, 2, 1, 0], [1, 1, 1, 1]]))
    assert placed.tolist() == [[0, 1, 2, 3], [3, 2, 1, 0], [1, 0, 2, 3]]
    rng = np.random.default_rng(5)
    for _ in range(200):
        sources = rng.integers(0, 4, size=(1, 4))
        rows = place_children(sources)[0]
        assert sorted(rows.tolist()) == [0, 1, 2, 3]  # every row holds one next beam
        copies = int((rows != sources[0]).sum())
        assert copies == 4 - len(set(sources[0].tolist()))  # one copy per beam that died
