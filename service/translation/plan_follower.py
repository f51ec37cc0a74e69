"""A front-end's registry following the supervisor's plan (the multi-process service): a
loaded model is out of date once the plan names engine cores other than those its client talks
to, which happens when the supervisor has started engine cores of a new revision
(service/processes/swaps.py). The registry then swaps it as it swaps a new revision in one
process: the new client (and the new revision's tokenizer) serves the new requests, the old one
closes after its last request. Once no loaded model is out of date and the old clients have
closed, this front-end sends nothing to the old engine cores any more, and says so to the
supervisor (``PublishedPlan.acknowledge``), which then stops them.
"""

from __future__ import annotations

from service.engine_core.plan import PublishedPlan
from service.translation.slots import Freshness, ModelSlot


class PlanFollower(Freshness):
    def __init__(self, plan: PublishedPlan) -> None:
        self.plan = plan

    def refresh(self) -> None:
        self.plan.refresh()

    def outdated(self, slot: ModelSlot) -> bool:
        addresses = self.plan.current.addresses.get(slot.spec.model_id, [])
        return slot.model is not None and slot.model.core_addresses != tuple(addresses)

    def settled(self) -> None:
        self.plan.acknowledge()
