"""What several of the load-test tooling's tests share.

No assertion in these tests depends on how fast the machine is: the sender tests check
recorded offsets against the schedule and the order of events, with wide tolerances.
"""

from __future__ import annotations

from loadtest.client import (
    RequestRecord,
)

URL = "http://loadtest.invalid"  # MockTransport: nothing leaves the process


def ok_record(
    index: int, latency_s: float, *, scheduled_s: float = 0.0, tokens: int = 3
) -> RequestRecord:
    return RequestRecord(
        index=index,
        scheduled_s=scheduled_s,
        sent_s=scheduled_s,
        latency_s=latency_s,
        status=200,
        output_chars=10,
        output_tokens=tokens,
    )
