"""The batching settings (``MT_MAX_BATCH_ROWS`` ... ``MT_ENCODER_OVERLAP``): the knobs of the
continuous batcher, in the units the environment gives them.

The batcher (service/scheduling/batcher.py) and its scheduler (service/scheduling/scheduler.py)
take this object itself; service/config.py reads it from the environment as part of
``Settings``. The scheduler's fixed bounds (the knee's
tolerance, the in-line stall bound, the encoder thread's priority and lag bound) are named
constants beside the code that uses them, not settings.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

# When queued sentences may join the batch (``MT_BATCHING``; the policies are the scheduler's).
BatchingPolicy = Literal["continuous", "static"]

# MT_MAX_QUEUE's floor, and its value where nothing else is known.
DEFAULT_MAX_QUEUE = 256
# The shortest sentence a model translates: a letter, a full stop and a space ("A. ").
SHORTEST_SENTENCE_CHARS = 3


class BatchingSettings(BaseModel):
    """Batching."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    max_batch_rows: int = Field(
        64, ge=1, description="Most rows (sentences x beams) in one decoder step."
    )
    max_batch_tokens: int = Field(
        8192,
        ge=16,
        description="Most source tokens (rows x padded length) admitted into the running batch.",
    )
    max_queue: int | None = Field(
        None,
        ge=1,
        description="Most queued sentences; beyond it requests get 429 (an empty queue takes "
        "any request within the text limits). Unset: four texts of MT_MAX_CHARS_PER_TEXT "
        "characters in the shortest sentences (3 characters: 6667 for 5000), at least 256.",
    )
    batching: BatchingPolicy = Field(
        "continuous",
        description="Admission policy. `continuous`: queued sentences join the running batch "
        "at every decoder step and finished rows leave at once. `static` (a baseline for "
        "comparison, like Triton's dynamic batcher): while the engine is idle, wait until "
        "max_batch_rows rows are queued or the oldest has waited static_max_wait_ms, admit "
        "that batch, and step it until all of its rows have finished before admitting again.",
    )
    static_max_wait_ms: float = Field(
        10.0,
        ge=0,
        description="`static` batching: longest time the oldest queued sentence waits for a "
        "full batch while the engine is idle (Triton's max_queue_delay); also `continuous` "
        "batching's idle wait on one CPU unless admission_idle_wait_ms is set.",
    )
    admission_idle_wait_ms: float | None = Field(
        None,
        ge=0,
        description="`continuous` batching: while the engine is idle, the oldest queued "
        "sentence waits up to this long for others to share its encoder call and first steps "
        "(as `static` batching waits static_max_wait_ms), where submissions come at least "
        "once in such a wait. Default: static_max_wait_ms where the encoder runs in line (one "
        "CPU), where a newcomer arriving just after an admission rarely joins it; 0 with "
        "encoder_overlap, where it joins from the encoder thread.",
    )
    background_max_rows: int = Field(
        4,
        ge=1,
        description="Rows of document-job sentences in the running batch at most. They join "
        "only when no interactive sentence waits, so a long document uses the engine's spare "
        "steps without slowing interactive requests much.",
    )
    background_max_wait_ms: float = Field(
        1000.0,
        ge=0,
        description="Document-job sentences join a batch with interactive rows running only "
        "once the oldest has waited this long (otherwise at a step boundary with none): "
        "documents use the spare steps, and still move under a steady interactive load.",
    )
    admission_cost_aware: bool = Field(
        True,
        description="`continuous` batching only: the engine's cost models (calibrated at "
        "start-up, refitted from live timings) decide how rows are grouped into decoder calls "
        "and who joins the running batch: newcomers join while it stays within the row count "
        "where this machine's tokens/s peak (within a fixed tolerance of 5 %), and only when "
        "the delay summed over running rows and newcomers is lower joining now than waiting "
        "for the batch to drain. Off: every newcomer that fits joins at once.",
    )
    admission_max_tokens: int = Field(
        1024,
        ge=1,
        description="Most source tokens encoded for newcomers in one step (an empty batch "
        "always takes the head of the queue): bounds how long running rows wait for an "
        "admission's encoder calls.",
    )
    encoder_overlap: bool = Field(
        True,
        description="Continuous batching: newcomers are encoded on a second thread while the "
        "running rows take their decoder steps, and join the batch once encoded, so running "
        "rows do not wait for admissions' encoder calls. Only where a core is spare: with "
        "one CPU (affinity and cgroup quota) the encoder runs in line whatever this says.",
    )

    def queue_for(self, max_chars_per_text: int) -> BatchingSettings:
        """These settings with ``max_queue`` filled in when unset: a queue that holds a text
        of ``max_chars_per_text`` characters cut into the shortest sentences, so requests
        within the advertised limits are not refused while the server is all but idle."""
        if self.max_queue is not None:
            return self
        shortest = -(-max_chars_per_text // SHORTEST_SENTENCE_CHARS)
        return self.model_copy(update={"max_queue": max(DEFAULT_MAX_QUEUE, shortest)})

    @property
    def static_max_wait_s(self) -> float:
        return self.static_max_wait_ms / 1000

    @property
    def background_max_wait_s(self) -> float:
        return self.background_max_wait_ms / 1000

    def idle_wait_s(self, encoder_overlap: bool) -> float:
        """How long the oldest queued sentence waits for company while the engine is idle
        (continuous batching): ``admission_idle_wait_ms``, by default the static wait where
        the encoder runs in line and none where it overlaps the steps."""
        idle_wait_ms = self.admission_idle_wait_ms
        if idle_wait_ms is None:
            idle_wait_ms = 0.0 if encoder_overlap else self.static_max_wait_ms
        return idle_wait_ms / 1000
