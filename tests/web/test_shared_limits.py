"""Rate limits shared by the front-ends of the multi-process service
(service/web/shared_limits.py): the same windows, refusals and Retry-After as the in-process
limiter, and one limit for all the processes that open the file."""

from __future__ import annotations

import random
import subprocess
import sys
import time
from pathlib import Path

from service.storage.sqlite import SqliteDatabase
from service.web.rate_limits import RateLimiter
from service.web.shared_limits import SharedRateLimiter

ROOT = Path(__file__).resolve().parents[2]


class FakeClock:
    def __init__(self) -> None:
        # not in the past: limits' memory storage drops entries whose expiry the real clock
        # has passed
        self.now = time.time()

    def __call__(self) -> float:
        return self.now


def test_the_shared_windows_refuse_what_the_in_process_ones_refuse(tmp_path):
    clock = FakeClock()
    local = RateLimiter(clock)
    # two front-ends' connections to one file
    shared = [
        SharedRateLimiter(SqliteDatabase(tmp_path / "limits.sqlite3", write_ahead_log=True), clock)
        for _ in range(2)
    ]
    draw = random.Random(7)
    for turn in range(400):
        identity = draw.choice(["key:a", "key:b"])
        limits = {"requests_per_minute": 5, "chars_per_minute": 60}
        chars = draw.choice([0, 1, 5, 20, 61])
        expected = local.charge(identity, chars=chars, **limits)
        got = shared[turn % 2].charge(identity, chars=chars, **limits)
        assert got == expected, (turn, identity, chars)
        clock.now += draw.choice([0.0, 0.5, 3.0, 11.0])


CHARGER = """
import sys, time
from pathlib import Path
from service.storage.databases import open_databases
from service.web.shared_limits import SharedRateLimiter
limiter = SharedRateLimiter(open_databases(Path(sys.argv[1]), None).limits)
while time.time() < float(sys.argv[2]):
    time.sleep(0.001)
allowed = sum(
    limiter.charge("key:a", chars=1, requests_per_minute=10, chars_per_minute=0) is None
    for _ in range(10)
)
print(allowed)
"""


def test_processes_sharing_the_file_allow_the_limit_once_between_them(tmp_path):
    start_at = str(time.time() + 1.5)  # all charge at once
    processes = [
        subprocess.Popen(
            [sys.executable, "-c", CHARGER, str(tmp_path), start_at],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(3)
    ]
    allowed = [int(process.communicate(timeout=60)[0]) for process in processes]
    assert sum(allowed) == 10, allowed


def test_front_ends_of_the_multi_process_service_share_their_windows(tmp_path):
    from service.config import Settings
    from service.engine_core.plan import ProcessPlan
    from service.wiring import create_app

    settings = Settings(data_dir=tmp_path, exports=[tmp_path / "none"], language_detection=False)
    front_end = create_app(settings, engine_cores=ProcessPlan(2, 1, 1, 2))
    assert isinstance(front_end.state.access.limiter, SharedRateLimiter)
    assert isinstance(create_app(settings).state.access.limiter, RateLimiter)
