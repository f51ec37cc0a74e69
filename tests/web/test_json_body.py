"""A body read by hand as JSON (the compatibility routes): an unpaired surrogate is refused
however it arrives, and a body that cannot hold one is not walked for one."""

from __future__ import annotations

import asyncio
import codecs

import pytest
from starlette.requests import Request

from service.web import deps
from service.web.errors import ApiError


def read(raw: bytes):
    async def receive():
        return {"type": "http.request", "body": raw, "more_body": False}

    request = Request({"type": "http", "method": "POST", "headers": []}, receive)
    return asyncio.run(deps.json_body(request))


@pytest.mark.parametrize(
    "raw",
    [
        b'{"q": "a\\ud800"}',  # an escape
        b'{"q": ["ok", {"k": "\\udfff"}]}',  # nested
        b'{"q": "a\xed\xa0\x80"}',  # a surrogate encoded in UTF-8 (json decodes surrogatepass)
        '{"q": "a\ud800"}'.encode("utf-16-le", "surrogatepass"),  # UTF-16, detected by json
        codecs.BOM_UTF8 + b'{"q": "a\\ud800"}',
    ],
)
def test_an_unpaired_surrogate_is_refused_however_it_arrives(raw):
    with pytest.raises(ApiError) as refused:
        read(raw)
    assert (refused.value.status, refused.value.code) == (400, "invalid_unicode")


@pytest.mark.parametrize(
    "raw, expected",
    [
        (b'{"q": "Sch\xc3\xb6n \xed\x9f\xbf"}', {"q": "Schön \ud7ff"}),  # Hangul-range ED bytes
        (b'{"q": "\\ud83d\\ude00"}', {"q": "\U0001f600"}),  # a pair is one character
        (b"", {}),
    ],
)
def test_valid_bodies_are_read_as_json_reads_them(raw, expected):
    assert read(raw) == expected


def test_a_plain_utf8_body_is_not_walked(monkeypatch):
    walked = []
    monkeypatch.setattr(deps, "_check_unicode", walked.append)
    assert read('{"q": ["Schön", "Grüße"], "source": "de"}'.encode()) == {
        "q": ["Schön", "Grüße"],
        "source": "de",
    }
    assert walked == []
    read(b'{"q": "\\u00fc"}')
    assert walked == [{"q": "ü"}]
