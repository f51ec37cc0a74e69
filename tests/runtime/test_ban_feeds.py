"""A group's bans and watched ids (service/runtime/feeds.py): built from the searches' own
arrays, and reused while none of them changes."""

from __future__ import annotations

from service.runtime.feeds import BanFeeds
from service.runtime.search import GreedySearch
from service.runtime.stepping import ActiveRequest
from service.runtime.types import DecodeRequest

EOS, PAD, SYMBOLS = 0, 99, {7: 1, 8: 0}  # the source has symbol 7 once, symbol 8 never


def _active(request_id: int) -> ActiveRequest:
    search = GreedySearch(10, EOS, PAD, copy_tokens=dict(SYMBOLS))
    return ActiveRequest(DecodeRequest(request_id, [5, 6, EOS], 1, 10), search, 3)


def test_constrained_rows_ban_what_their_searches_ban_and_the_arrays_are_reused():
    feeds, requests = BanFeeds(), [_active(0), _active(1)]
    banned, watch = feeds.arrays(requests, 2, PAD, [PAD], constrained=True)
    # static pad, then symbol 8 (never in the source) and eos (symbol 7 still owed)
    assert banned.tolist() == [[PAD, PAD, 8, EOS]] * 2
    assert watch.tolist() == [[7, 8, EOS, PAD]] * 2
    assert feeds.arrays(requests, 2, PAD, [PAD], constrained=True)[0] is banned  # unchanged

    requests[1].search.take(7)  # row 1 emits its symbol: 7 is used up, eos allowed again
    banned_next, _ = feeds.arrays(requests, 2, PAD, [PAD], constrained=True)
    assert banned_next is not banned
    assert banned_next.tolist() == [[PAD, PAD, 8, EOS], [PAD, 7, 8, PAD]]

    swapped = [requests[1], requests[0]]  # the rows' order changes: the arrays follow it
    banned_swapped, _ = feeds.arrays(swapped, 2, PAD, [PAD], constrained=True)
    assert banned_swapped.tolist() == [[PAD, 7, 8, PAD], [PAD, PAD, 8, EOS]]


def test_an_unconstrained_row_beside_constrained_ones_bans_only_the_static_ids():
    plain = ActiveRequest(DecodeRequest(2, [5, EOS], 1, 10), GreedySearch(10, EOS, PAD), 2)
    banned, watch = BanFeeds().arrays([_active(0), plain], 2, PAD, [PAD], constrained=True)
    assert banned.tolist() == [[PAD, PAD, 8, EOS], [PAD, PAD, PAD, PAD]]
    assert watch.tolist() == [[7, 8, EOS, PAD], [PAD, PAD, PAD, PAD]]
