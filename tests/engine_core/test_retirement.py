"""A retired engine core's account of the front-ends that hold it
(service/engine_core/retirement.py): it says ``Free`` once each detached or went silent, never
while one has rows in flight there, and once."""

from __future__ import annotations

from service.engine_core.protocol import Retire
from service.engine_core.retirement import PEER_SILENCE_S, Retirement

FRONTEND_A = b"frontend-101-aaaa"
FRONTEND_B = b"frontend-202-bbbb"
SUPERVISOR = b"supervisor"
ORDER = Retire(["ipc://new"], 1)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def retired(clock: Clock, *frontends: bytes) -> Retirement:
    retirement = Retirement(clock=clock)
    for peer in frontends:
        retirement.heard(peer)
    retirement.heard(SUPERVISOR)  # the supervisor is no holder
    retirement.retire(SUPERVISOR, ORDER)
    return retirement


def test_a_core_is_not_free_before_it_is_retired():
    clock = Clock()
    retirement = Retirement(clock=clock)
    clock.now += 10 * PEER_SILENCE_S
    assert not retirement.free([])


def test_a_retired_core_is_free_once_every_frontend_detached():
    clock = Clock()
    retirement = retired(clock, FRONTEND_A, FRONTEND_B)
    clock.now += PEER_SILENCE_S / 2
    retirement.heard(FRONTEND_A)  # pings on: attached
    retirement.heard(FRONTEND_B)
    retirement.detach(FRONTEND_A)
    clock.now += PEER_SILENCE_S / 2
    retirement.heard(FRONTEND_A)  # a ping on its way as it detached: still detached
    assert retirement.holders([]) == {FRONTEND_B}
    assert not retirement.free([])
    retirement.detach(FRONTEND_B)
    assert retirement.free([]) and retirement.supervisor == SUPERVISOR


def test_a_core_retired_with_no_frontend_waits_the_silence_for_one_connecting():
    clock = Clock()
    retirement = retired(clock)
    assert not retirement.free([])
    clock.now += PEER_SILENCE_S - 0.1
    retirement.heard(FRONTEND_A)  # a front-end that was starting: it learns the move now
    clock.now += 0.2
    assert not retirement.free([])
    retirement.detach(FRONTEND_A)
    assert retirement.free([])


def test_a_killed_frontend_stops_holding_the_core_after_the_silence():
    clock = Clock()
    retirement = retired(clock, FRONTEND_A)
    clock.now += PEER_SILENCE_S - 0.1
    assert not retirement.free([])
    clock.now += 0.2  # never heard again, never detached
    assert retirement.free([])


def test_a_frontend_with_rows_in_flight_holds_the_core_even_when_silent():
    clock = Clock()
    retirement = retired(clock, FRONTEND_A)
    clock.now += 10 * PEER_SILENCE_S
    assert not retirement.free([FRONTEND_A])
    assert retirement.free([])


def test_free_is_said_once():
    clock = Clock()
    retirement = retired(clock)
    clock.now += PEER_SILENCE_S
    assert retirement.free([])
    retirement.reported = True
    assert not retirement.free([])
