"""The access line (text logs): written by a formatter that builds it in one go, and exactly
the line uvicorn's own ``AccessFormatter`` writes in ``ACCESS_FORMAT`` without colours; its
handler flushes once an event-loop iteration."""

from __future__ import annotations

import asyncio
import io
import logging

import pytest
from uvicorn.logging import AccessFormatter

from service.web.request_id import (
    ACCESS_FORMAT,
    AccessLineFormatter,
    LoopFlushedHandler,
    RequestIdLogFilter,
    install_request_id_logging,
)


def _record(created: float, status: int, path: str = "/translate?x=1") -> logging.LogRecord:
    record = logging.LogRecord(
        "uvicorn.access",
        logging.INFO,
        __file__,
        1,
        '%s - "%s %s HTTP/%s" %d',
        ("127.0.0.1:51234", "POST", path, "1.1", status),
        None,
    )
    record.created, record.msecs = created, (created - int(created)) * 1000
    record.request_id = "5f2c0a"
    return record


@pytest.mark.parametrize("status", [200, 404, 429, 499, 503, 599])
def test_the_access_line_is_uvicorns_line(status):
    ours, uvicorns = AccessLineFormatter(), AccessFormatter(ACCESS_FORMAT, use_colors=False)
    for created in (1_764_400_000.0071, 1_764_400_000.9999, 1_764_400_001.5, 1_764_400_062.25):
        record = _record(created, status)
        assert ours.format(record) == uvicorns.format(_record(created, status))


def test_the_status_phrase_and_the_date_are_worked_out_once():
    formatter = AccessLineFormatter()
    formatter.format(_record(1_764_400_000.1, 200))
    formatter.format(_record(1_764_400_000.2, 200))
    assert formatter._statuses == {200: "200 OK"}
    assert formatter._second == 1_764_400_000


class CountingStream(io.StringIO):
    def __init__(self) -> None:
        super().__init__()
        self.flushes = 0

    def flush(self) -> None:
        self.flushes += 1
        super().flush()


def test_access_lines_of_one_loop_iteration_are_flushed_once_by_its_end():
    stream = CountingStream()
    handler = LoopFlushedHandler(stream)
    handler.setFormatter(logging.Formatter("%(message)s"))

    async def respond_to_three() -> int:
        for status in (200, 200, 429):
            handler.handle(logging.makeLogRecord({"msg": f"line {status}"}))
        flushed_during = stream.flushes
        await asyncio.sleep(0)  # the iteration ends
        await asyncio.sleep(0)
        return flushed_during

    assert asyncio.run(respond_to_three()) == 0
    assert stream.flushes == 1
    assert stream.getvalue() == "line 200\nline 200\nline 429\n"


def test_access_lines_off_the_event_loop_are_flushed_at_once():
    stream = CountingStream()
    handler = LoopFlushedHandler(stream)
    handler.handle(logging.makeLogRecord({"msg": "line"}))
    assert stream.flushes == 1


def test_uvicorns_access_handler_becomes_loop_flushed_with_its_stream_and_filters():
    logger = logging.getLogger("uvicorn.access")
    saved = logger.handlers[:]
    stream = io.StringIO()
    plain = logging.StreamHandler(stream)
    plain.setLevel(logging.INFO)
    logger.handlers = [plain]
    try:
        install_request_id_logging()
        install_request_id_logging()  # again after uvicorn's setup: still one handler
        [handler] = logger.handlers
        assert isinstance(handler, LoopFlushedHandler)
        assert handler.stream is stream and handler.level == logging.INFO
        assert isinstance(handler.formatter, AccessLineFormatter)
        assert [type(f) for f in handler.filters] == [RequestIdLogFilter]
    finally:
        logger.handlers = saved
