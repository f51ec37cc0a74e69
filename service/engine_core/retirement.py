"""An engine core's retirement, as the core sees it: which front-ends still hold it once the
supervisor's ``Retire`` moved its model to new engine cores, and when it is free to stop.

A front-end holds the core while it has rows in flight there, or while it is attached: heard
from (its client pings every 0.1 s) within ``PEER_SILENCE_S`` and not detached. So a front-end
that moves on detaches at once, and one that was killed or hangs lets go after the silence
rather than holding the core until the supervisor's backstop. The core is free once retired
for the silence at least (a front-end connecting as the order came has time to be heard: it
learns the move from its first pong) and nobody holds it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable

from service.engine_core.protocol import Retire

# Every front-end socket (the client's, and the probe that finds a model's cores) names itself
# so; the supervisor's socket does not, and is no holder.
FRONTEND_PREFIX = b"frontend-"
# A front-end silent this long is gone: ten times its clients' ping interval and more than
# the longest pause of its event loop seen under load.
PEER_SILENCE_S = 3.0


class Retirement:
    """Who holds the engine core, and whether the supervisor's order may be answered ``Free``."""

    def __init__(
        self, silence_s: float = PEER_SILENCE_S, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.order: Retire | None = None
        self.supervisor: bytes | None = None  # the peer that sent the order
        self.reported = False  # ``Free`` sent
        self._silence_s = silence_s
        self._clock = clock
        self._retired_at = 0.0
        self._heard: dict[bytes, float] = {}
        self._detached: set[bytes] = set()

    def heard(self, peer: bytes) -> None:
        """A message from ``peer``."""
        if peer.startswith(FRONTEND_PREFIX) and peer not in self._detached:
            self._heard[peer] = self._clock()

    def detach(self, peer: bytes) -> None:
        self._detached.add(peer)
        self._heard.pop(peer, None)

    def retire(self, peer: bytes, order: Retire) -> None:
        """The supervisor's order (sent again, it changes nothing but the successors)."""
        if self.order is None:
            self._retired_at = self._clock()
        self.order, self.supervisor = order, peer

    def holders(self, busy: Iterable[bytes]) -> set[bytes]:
        """The front-ends holding the core: ``busy`` (rows in flight) and the attached ones."""
        now = self._clock()
        attached = {peer for peer, at in self._heard.items() if now - at < self._silence_s}
        return attached | set(busy)

    def free(self, busy: Iterable[bytes]) -> bool:
        """Whether to send ``Free`` now: retired for the silence, nobody holding, not sent."""
        if self.order is None or self.reported:
            return False
        if self._clock() - self._retired_at < self._silence_s:
            return False
        return not self.holders(busy)
