"""The client behind trusted proxies (MT_TRUSTED_PROXIES): ``X-Forwarded-For`` and
``Forwarded`` are read only from a trusted peer, from the right, and what they name is the
client of rate limits, DeepL's monthly counts and the request log."""

from __future__ import annotations

import io
import json
import logging
import time

import pytest
from fastapi.testclient import TestClient

from service.config import Settings
from service.web.forwarded import TrustedProxies
from service.web.request_log import JsonFormatter
from service.web.server import uvicorn_config
from service.wiring import create_app
from tests.service_fixtures import tiny_model

PROXY = ("10.0.0.5", 40000)  # inside the trusted 10.0.0.0/8
OUTSIDER = ("203.0.113.9", 40000)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return tiny_model(tmp_path_factory)


def client_of(peer: str, **headers: str) -> str:
    proxies = TrustedProxies.parse("10.0.0.0/8, ::1")
    raw = [
        (name.replace("_", "-").lower().encode(), value.encode()) for name, value in headers.items()
    ]
    return proxies.client(peer, raw)[0]


# --- reading the headers -----------------------------------------------------------------------


def test_an_untrusted_peer_is_the_client_whatever_it_sends():
    assert client_of("203.0.113.9", x_forwarded_for="198.51.100.1") == "203.0.113.9"
    assert client_of("203.0.113.9", forwarded="for=198.51.100.1") == "203.0.113.9"


def test_the_right_most_untrusted_address_is_the_client():
    # The client wrote a spoofed address; the trusted proxies appended what they saw.
    chain = "6.6.6.6, 198.51.100.7, 10.1.2.3"
    assert client_of("10.0.0.5", x_forwarded_for=chain) == "198.51.100.7"


def test_forwarded_is_read_with_ports_and_ipv6_brackets():
    header = 'for=6.6.6.6, for="[2001:db8::7]:4711";proto=https, for=10.1.2.3:80'
    assert client_of("::1", forwarded=header) == "2001:db8::7"
    assert TrustedProxies.parse("::1").client("::1", [(b"forwarded", header.encode())]) == (
        "10.1.2.3",
        None,
    )


def test_an_ipv4_peer_on_a_dual_stack_socket_is_in_the_ipv4_ranges():
    assert client_of("::ffff:10.0.0.5", x_forwarded_for="198.51.100.7") == "198.51.100.7"


def test_the_scheme_comes_from_the_trusted_proxy():
    proxies = TrustedProxies.parse("10.0.0.0/8")
    headers = [(b"x-forwarded-for", b"198.51.100.7"), (b"x-forwarded-proto", b"https")]
    assert proxies.client("10.0.0.5", headers) == ("198.51.100.7", "https")
    assert proxies.client("203.0.113.9", headers) == ("203.0.113.9", None)


def test_forwarded_wins_over_x_forwarded_for():
    assert (
        client_of("10.0.0.5", x_forwarded_for="6.6.6.6", forwarded="for=198.51.100.7")
        == "198.51.100.7"
    )


def test_without_trusted_proxies_nothing_is_read():
    assert TrustedProxies.parse("").client("10.0.0.5", [(b"x-forwarded-for", b"1.2.3.4")]) == (
        "10.0.0.5",
        None,
    )


def test_a_bad_entry_in_the_setting_stops_the_start():
    with pytest.raises(ValueError, match="not-an-address"):
        Settings(trusted_proxies="10.0.0.0/8,not-an-address")


def test_uvicorn_does_not_apply_its_own_proxy_rule(model_dir):
    settings = Settings(exports=[model_dir])
    assert uvicorn_config(create_app(settings), settings).proxy_headers is False


# --- against the app ---------------------------------------------------------------------------


def serve(model_dir, peer: tuple[str, int], **overrides) -> TestClient:
    fields = {"trusted_proxies": "10.0.0.0/8", "rate_limit_requests_per_minute": 1, **overrides}
    settings = Settings(
        exports=[model_dir], provider="cpu", intra_op_threads=1, max_new_tokens=4, **fields
    )
    client = TestClient(create_app(settings), client=peer)
    client.__enter__()
    for _ in range(3000):
        if client.get("/ready").status_code == 200:
            return client
        time.sleep(0.01)
    raise AssertionError("never ready")


@pytest.mark.parametrize("proxies", ["10.0.0.0/8", ""])  # "": no layer reads the headers
def test_a_spoofed_header_from_an_untrusted_peer_changes_nothing(model_dir, proxies):
    client = serve(model_dir, OUTSIDER, trusted_proxies=proxies)
    try:
        first = client.post(
            "/v1/translate", json={"text": "Save"}, headers={"X-Forwarded-For": "198.51.100.1"}
        )
        assert first.status_code == 200, first.text
        for spoof in ({"X-Forwarded-For": "198.51.100.2"}, {"Forwarded": "for=198.51.100.3"}):
            again = client.post("/v1/translate", json={"text": "Save"}, headers=spoof)
            assert again.status_code == 429  # still the peer's one request a minute
    finally:
        client.__exit__(None, None, None)


def test_through_a_trusted_proxy_two_clients_get_their_own_limits(model_dir):
    client = serve(model_dir, PROXY)
    try:
        for forwarded in ("198.51.100.1", "198.51.100.2"):
            headers = {"X-Forwarded-For": forwarded}
            response = client.post("/v1/translate", json={"text": "Save"}, headers=headers)
            assert response.status_code == 200, response.text
        headers = {"X-Forwarded-For": "6.6.6.6, 198.51.100.1"}  # a spoof prepended: no escape
        assert (
            client.post("/v1/translate", json={"text": "Save"}, headers=headers).status_code == 429
        )
        forwarded = {"Forwarded": 'for="198.51.100.2:5555";proto=https'}
        assert (
            client.post("/v1/translate", json={"text": "Save"}, headers=forwarded).status_code
            == 429
        )
    finally:
        client.__exit__(None, None, None)


def test_deepl_monthly_counts_are_per_forwarded_client(model_dir, tmp_path):
    client = serve(model_dir, PROXY, rate_limit_requests_per_minute=0, data_dir=tmp_path)
    try:
        body = {"text": ["Save"], "target_lang": "DE", "source_lang": "EN"}
        headers = {"X-Forwarded-For": "198.51.100.1"}
        assert client.post("/v2/translate", json=body, headers=headers).status_code == 200
        counted = client.get("/v2/usage", headers=headers).json()["character_count"]
        other = client.get("/v2/usage", headers={"X-Forwarded-For": "198.51.100.2"}).json()
        assert (counted, other["character_count"]) == (4, 0)
    finally:
        client.__exit__(None, None, None)


def test_the_request_log_names_the_client(model_dir, caplog, tmp_path):
    caplog.set_level(logging.INFO)
    buffer = io.StringIO()
    handler = logging.StreamHandler(buffer)
    handler.setFormatter(JsonFormatter())
    logging.getLogger().addHandler(handler)
    client = serve(
        model_dir, PROXY, log_format="json", rate_limit_requests_per_minute=0, data_dir=tmp_path
    )
    try:
        headers = {"X-Forwarded-For": "198.51.100.42"}
        assert client.post("/v1/translate", json={"text": "Save"}, headers=headers).is_success
        assert client.get("/health").is_success  # from the proxy itself
    finally:
        client.__exit__(None, None, None)
        logging.getLogger().removeHandler(handler)
    records = [json.loads(line) for line in buffer.getvalue().splitlines() if line]
    requests = [r for r in records if r["logger"] == "mtserve.requests"]
    [served] = [r for r in requests if r["route"] == "/v1/translate"]
    assert served["client"] == "198.51.100.42"
    assert [r["client"] for r in requests if r["route"] == "/health"][-1] == PROXY[0]
