"""A front-end's registry following the supervisor's plan (the multi-process service): where
each model's engine cores are now, as this front-end has learnt it. The supervisor's command
line gives the plan at start; a retired engine core's pong gives each move since (its client
calls ``moved``, service/engine_core/client.py). A loaded model is out of date once the plan
names engine cores other than those its client talks to; the registry then swaps it as it
swaps a new revision in one process, at once (``wake``): the new client (and the new
revision's tokenizer) serves the new requests, the old one closes after its last request and
detaches from the old engine cores, which the supervisor then stops.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from service.engine_core.plan import ProcessPlan
from service.translation.slots import Freshness, ModelSlot

logger = logging.getLogger(__name__)


class PlanFollower(Freshness):
    def __init__(self, plan: ProcessPlan) -> None:
        self.addresses = {model_id: list(at) for model_id, at in plan.addresses.items()}
        # one version per model: the moves of two models may be heard in either order
        self._versions = dict.fromkeys(plan.addresses, plan.version)
        self.wake: Callable[[], None] = lambda: None  # the registry's catch-up (wiring sets it)

    def follow(self, model_id: str, addresses: list[str], version: int) -> bool:
        """The model moved to ``addresses`` in plan ``version``; whether that is news."""
        if version <= self._versions.get(model_id, -1):
            return False
        self.addresses[model_id], self._versions[model_id] = list(addresses), version
        return True

    def moved(self, model_id: str, addresses: list[str], version: int) -> None:
        """A client heard the move (event loop; each pong of a retired core tells it again):
        the registry swaps the model now."""
        if self.follow(model_id, addresses, version):
            logger.info("model %s moved to other engine cores (plan version %d)", model_id, version)
            self.wake()

    def outdated(self, slot: ModelSlot) -> bool:
        addresses = self.addresses.get(slot.spec.model_id, [])
        return slot.model is not None and slot.model.core_addresses != tuple(addresses)
