"""Locust users that post the same input mix as the other load tests.

Locust users are closed-loop (each waits for its response, then ``wait_time``), so use it for
its live web UI and for many-user scenarios; use ``loadtest.open_loop`` / ``loadtest.sweep``
for latency at a given arrival rate. Headless, bounded run against a local service:

    .venv/bin/locust -f loadtest/locustfile.py --headless -H http://127.0.0.1:8000 \\
        -u 8 -r 2 -t 60s --csv loadtest/results/locust

Environment: ``LOADTEST_MIX`` (e.g. ``ui=0.8,help=0.2``), ``LOADTEST_SEED`` (base seed; each
user adds its number), ``LOADTEST_TEXTS_PER_REQUEST``, ``LOADTEST_BEAM_SIZE``.
"""

from __future__ import annotations

import itertools
import os
import sys
from pathlib import Path

from locust import HttpUser, between, task

# Locust puts this file's folder on sys.path, not the repository root.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from loadtest.client import TRANSLATE_PATH  # noqa: E402
from loadtest.inputs import DEFAULT_WEIGHTS, InputSampler, parse_weights  # noqa: E402

_user_numbers = itertools.count()


def _sampler_for_next_user() -> InputSampler:
    mix = os.environ.get("LOADTEST_MIX")
    beam = os.environ.get("LOADTEST_BEAM_SIZE")
    return InputSampler(
        seed=int(os.environ.get("LOADTEST_SEED", "0")) + next(_user_numbers),
        weights=parse_weights(mix) if mix else dict(DEFAULT_WEIGHTS),
        texts_per_request=int(os.environ.get("LOADTEST_TEXTS_PER_REQUEST", "1")),
        beam_size=int(beam) if beam else None,
    )


class TranslateUser(HttpUser):
    """A client of ``POST /v1/translate``: a short pause between requests, 429 counted as a
    failure under its own name so it stands out in the statistics."""

    host = "http://127.0.0.1:8000"
    wait_time = between(0.1, 0.5)

    def on_start(self) -> None:
        self.sampler = _sampler_for_next_user()
        self.client.trust_env = (
            False  # loopback load never goes through a proxy from the environment
        )

    @task
    def translate(self) -> None:
        payload = self.sampler.next_payload()
        with self.client.post(
            TRANSLATE_PATH, json=payload, name=TRANSLATE_PATH, catch_response=True
        ) as response:
            if response.status_code == 200:
                try:
                    response.json()["translations"]
                except (ValueError, KeyError, TypeError):
                    response.failure("200 without translations")
                else:
                    response.success()
            elif response.status_code == 429:
                response.failure(
                    f"429 queue full (Retry-After {response.headers.get('Retry-After')})"
                )
            else:
                response.failure(f"HTTP {response.status_code}: {response.text[:100]}")
