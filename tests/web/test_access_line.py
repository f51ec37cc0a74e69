"""The access line (text logs): written by a formatter that builds it in one go, and exactly
the line uvicorn's own ``AccessFormatter`` writes in ``ACCESS_FORMAT`` without colours."""

from __future__ import annotations

import logging

import pytest
from uvicorn.logging import AccessFormatter

from service.web.request_id import ACCESS_FORMAT, AccessLineFormatter


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
