"""The messages between a front-end and an engine core, as msgpack (msgspec Structs), as vLLM
v1's engine core speaks to its API servers over ZeroMQ.

Only token ids and decoding options cross; text never does (the front-end tokenizes and
detokenizes). A front-end sends ``Submit`` (one request's rows), ``Abort`` (the rows nobody
waits for any more: the client timed out or hung up) and ``Ping``; the engine core answers with
``Accepted`` once the rows are queued (where the ``Submit`` asks: a stream starts only then),
``RowsDone`` once per engine step with every row of that front-end's requests the step
finished (vLLM's ``EngineCoreOutputs``: one message and one wakeup per step, not one per
row), ``Failed`` once for a request it refuses or cannot finish, and ``Pong``. A failure carries a kind, from which the client raises the same domain exception
the in-process batcher raises (``error_of``), so the web layer answers both alike.

The control messages move a model to engine cores of a new revision; the supervisor owns the
plan. It sends ``Retire`` to the old cores once the new ones answer a ping; from then on an old
core's ``Pong`` names its successors (``moved_to``), so each front-end moves within a ping. A
front-end whose last row on an old core is answered sends it ``Detach``; an old core that no
front-end holds any more (each detached, went silent, or never came) sends the supervisor
``Free``, and the supervisor stops it. A front-end that never reached the old cores (started
with the plan as it was before the move) does not wait on their dead sockets: while it looks
for a model's cores it asks the supervisor too (``Locate``), which answers with the same
``Retire`` where its plan names other cores for the model now.
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

from service.errors import EngineFailure, InvalidRow, NotAccepting, QueueFull
from service.runtime.types import DecodeRequest
from service.scheduling.sentences import RowResult


class Row(msgspec.Struct, array_like=True, frozen=True):
    """One sentence to decode: ``DecodeRequest`` without its id (the engine core numbers it)."""

    src_ids: list[int]
    beam_size: int
    max_new_tokens: int
    length_penalty: float
    copy_tokens: dict[int, int] | None
    forced_prefix: list[int]

    @classmethod
    def of(cls, request: DecodeRequest) -> Row:
        return cls(
            list(request.src_ids),
            request.beam_size,
            request.max_new_tokens,
            request.length_penalty,
            dict(request.copy_tokens) if request.copy_tokens is not None else None,
            list(request.forced_prefix),
        )

    def request(self) -> DecodeRequest:
        return DecodeRequest(
            src_ids=tuple(self.src_ids),
            beam_size=self.beam_size,
            max_new_tokens=self.max_new_tokens,
            length_penalty=self.length_penalty,
            copy_tokens=self.copy_tokens,
            forced_prefix=tuple(self.forced_prefix),
        )


# --- front-end -> engine core ----------------------------------------------------------------


class Submit(msgspec.Struct, tag="submit", array_like=True):
    request_id: int  # unique per front-end socket
    rows: list[Row]
    background: bool
    timeout_s: float | None
    # answer ``Accepted`` once queued: a stream's response starts only then, so that a full
    # queue is still the response's status (429) rather than the stream's first event
    acknowledge: bool = False


class Abort(msgspec.Struct, tag="abort", array_like=True):
    request_id: int


class Ping(msgspec.Struct, tag="ping", array_like=True):
    sent_at: float


class Detach(msgspec.Struct, tag="detach", array_like=True):
    """This front-end sends the (retired) engine core nothing any more."""


# --- supervisor -> engine core ---------------------------------------------------------------


class Retire(msgspec.Struct, tag="retire", array_like=True):
    """The model moved to ``successors`` in version ``plan_version`` of the plan. To an old
    engine core: say so in every pong, and send ``Free`` once no front-end holds this core. To
    a front-end that asked (``Locate``): the cores it asked about are not the plan's any more."""

    successors: list[str]
    plan_version: int


# --- front-end -> supervisor -----------------------------------------------------------------


class Locate(msgspec.Struct, tag="locate", array_like=True):
    """Where are ``model_id``'s engine cores now? (The front-end knows them at ``addresses``.)
    Answered with ``Retire`` where the plan names others, else not at all."""

    model_id: str
    addresses: list[str]


# --- engine core -> front-end ----------------------------------------------------------------


class RowDone(msgspec.Struct, array_like=True):
    """One finished row, as ``RowsDone`` carries it."""

    request_id: int
    index: int  # of the row in its Submit
    tokens: list[int]
    admitted_step: int
    finished_step: int
    queue_wait_s: float
    hypotheses: list[list[int]]

    @classmethod
    def of(cls, request_id: int, index: int, result: RowResult) -> RowDone:
        return cls(
            request_id,
            index,
            list(result.tokens),
            result.admitted_step,
            result.finished_step,
            result.queue_wait_s,
            [list(h) for h in result.hypotheses],
        )

    def result(self) -> RowResult:
        return RowResult(
            self.tokens, self.admitted_step, self.finished_step, self.queue_wait_s, self.hypotheses
        )


class RowsDone(msgspec.Struct, tag="rows", array_like=True):
    """Every row of one front-end's requests that one engine step finished."""

    rows: list[RowDone]


class Accepted(msgspec.Struct, tag="accepted", array_like=True):
    """The request's rows are queued (sent where its ``Submit`` asked)."""

    request_id: int


class Failed(msgspec.Struct, tag="failed", array_like=True):
    """The request's unfinished rows fail with this (the rows already answered stand)."""

    request_id: int
    kind: str  # queue_full, not_accepting, timeout, invalid_row, engine_failure
    message: str


class EngineCoreInfo(msgspec.Struct, array_like=True, frozen=True):
    """What a front-end needs to know of the model an engine core serves."""

    model_id: str
    provider: str  # the execution provider in use ("cpu", "cuda")
    max_positions: int | None  # the position table's size (the text pipeline's bound)
    max_queue: int


class CoreLoad(msgspec.Struct, array_like=True, frozen=True):
    pid: int
    accepting: bool  # False while it drains
    queue_depth: int  # sentences waiting for admission
    active_rows: int  # rows in the running batch


class Pong(msgspec.Struct, tag="pong", array_like=True):
    sent_at: float  # the Ping's, echoed
    info: EngineCoreInfo
    load: CoreLoad
    moved_to: list[str] | None = None  # retired: the successors' addresses
    plan_version: int = 0  # retired: the version of the plan that moved the model


class Free(msgspec.Struct, tag="free", array_like=True):
    """To the supervisor: no front-end holds this retired engine core any more."""

    plan_version: int


ToCore = Submit | Abort | Ping | Detach | Retire
FromCore = RowsDone | Accepted | Failed | Pong | Free

_encoder = msgspec.msgpack.Encoder()
_to_core = msgspec.msgpack.Decoder(ToCore)
_from_core = msgspec.msgpack.Decoder(FromCore)
_to_supervisor = msgspec.msgpack.Decoder(Locate)
_from_supervisor = msgspec.msgpack.Decoder(Retire)


def encode(message: ToCore | FromCore | Locate) -> bytes:
    return _encoder.encode(message)


def decode_to_core(data: bytes) -> ToCore:
    return _to_core.decode(data)


def decode_from_core(data: bytes) -> FromCore:
    return _from_core.decode(data)


def decode_to_supervisor(data: bytes) -> Locate:
    return _to_supervisor.decode(data)


def decode_from_supervisor(data: bytes) -> Retire:
    return _from_supervisor.decode(data)


def submit(
    request_id: int,
    rows: Sequence[DecodeRequest],
    background: bool,
    timeout_s: float | None,
    acknowledge: bool = False,
) -> Submit:
    return Submit(request_id, [Row.of(row) for row in rows], background, timeout_s, acknowledge)


# --- failures ---------------------------------------------------------------------------------


def failure_of(request_id: int, error: BaseException) -> Failed:
    """The message that makes the client raise what the batcher raised here."""
    if isinstance(error, QueueFull):
        return Failed(request_id, "queue_full", error.message)
    if isinstance(error, NotAccepting):
        return Failed(request_id, "not_accepting", error.reason)
    if isinstance(error, TimeoutError):
        return Failed(request_id, "timeout", "")
    if isinstance(error, InvalidRow):
        return Failed(request_id, "invalid_row", error.message)
    if isinstance(error, EngineFailure):
        return Failed(request_id, "engine_failure", error.message)
    return Failed(request_id, "engine_failure", f"the engine failed ({type(error).__name__})")


def error_of(failed: Failed) -> BaseException:
    """The domain exception a ``Failed`` stands for."""
    if failed.kind == "queue_full":
        return QueueFull(failed.message)
    if failed.kind == "not_accepting":
        return NotAccepting(failed.message)
    if failed.kind == "timeout":
        return TimeoutError()
    if failed.kind == "invalid_row":
        return InvalidRow(failed.message)
    return EngineFailure(failed.message)
