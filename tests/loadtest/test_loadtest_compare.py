"""Comparing batching policies in one run: latency by answer length, the interleaved plan
and sender, the control arm, and a control served from another checkout."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from loadtest.client import (
    RequestRecord,
)
from loadtest.open_loop import poisson_schedule
from tests.loadtest.loadtest_helpers import ok_record


def test_compare_splits_latency_by_answer_length():
    from loadtest.compare_batching import SHORT_OUTPUT_TOKENS, latency_by_length

    records = [
        ok_record(0, 0.010, tokens=SHORT_OUTPUT_TOKENS),
        ok_record(1, 0.030, tokens=3),
        ok_record(2, 0.200, tokens=SHORT_OUTPUT_TOKENS + 1),
        RequestRecord(index=3, scheduled_s=0.0, sent_s=0.0, latency_s=9.0, status=429),
    ]
    split = latency_by_length(records)
    assert split["short"]["requests"] == 2 and split["long"]["requests"] == 1
    assert split["long"]["latency_ms"]["p50"] == pytest.approx(200.0)  # the 429 is not counted
    assert split["short"]["latency_ms"]["max"] == pytest.approx(30.0)


def test_interleaved_plan_covers_the_schedule_once_and_alternates_the_order():
    from loadtest.compare_batching import POLICIES, interleaved_plan

    schedule = [0.1, 0.9, 1.0, 2.5, 3.99, 4.0]
    plan = interleaved_plan(schedule, duration_s=4.0, segments=4)
    assert [start for start, _, _ in plan] == [0.0, 1.0, 2.0, 3.0]
    assert [indices for _, indices, _ in plan] == [[0, 1], [2], [3], [4, 5]]  # the end: last
    assert [order for _, _, order in plan] == [POLICIES, POLICIES[::-1]] * 2
    assert interleaved_plan(schedule, 4.0, 1) == [(0.0, list(range(6)), POLICIES)]
    with pytest.raises(ValueError, match="segments"):
        interleaved_plan(schedule, 4.0, 0)


def test_interleaved_compare_sends_every_arrival_to_both_services_with_the_same_inputs(
    tmp_path, capsys
):
    import re

    from loadtest.compare_batching import main as compare_main

    stub = f"{sys.executable} -m loadtest.stub_server --port {{port}} --base-ms 1"
    argv = ["--spawn-server", "unused", "--server-command", stub, "--rate", "20"]
    argv += ["--duration", "1", "--interleave", "2", "--warmup", "0.5", "--no-plot"]
    assert compare_main(argv + ["--results-dir", str(tmp_path), "--name", "mixed"]) == 0

    warmed = re.findall(r"(\w+): warmed up, (\d+)/(\d+) ok", capsys.readouterr().out)
    assert sorted(policy for policy, _, _ in warmed) == ["continuous", "static"]
    assert all(int(ok) == int(sent) > 0 for _, ok, sent in warmed)
    document = json.loads((tmp_path / "mixed.json").read_text())
    assert document["config"]["interleave"] == 2
    assert document["config"]["warmup_s"] == 0.5
    runs = document["runs"]
    schedule = poisson_schedule(20, duration_s=1, seed=0)
    for policy in ("continuous", "static"):
        records = runs[policy]["records"]
        assert [r["index"] for r in records] == list(range(len(schedule)))
        assert [r["scheduled_s"] for r in records] == schedule
        assert all(r["status"] == 200 for r in records)
        assert runs[policy]["summary"]["requests"] == len(schedule)
        # sent on the schedule's clock: the sender's lag is small and never negative (each
        # segment's own clock started at its window, seconds after the schedule's)
        lag = runs[policy]["summary"]["sender_lag_ms"]
        assert 0 <= lag["p50"] <= lag["max"] < 500, lag
        # the warm-up's texts reached the service before its counters were read: not counted
        assert runs[policy]["summary"]["server"]["queue_wait"]["count"] == len(schedule)
    inputs = [[r["input_chars"] for r in runs[policy]["records"]] for policy in runs]
    assert inputs[0] == inputs[1] and len(set(inputs[0])) > 1


def test_a_control_arm_is_a_second_static_batcher_loaded_in_rotation(tmp_path, capsys):
    import re

    from loadtest.compare_batching import (
        CONTROL,
        POLICIES,
        interleaved_plan,
        policy_env,
        policy_of,
    )
    from loadtest.compare_batching import main as compare_main

    arms = (*POLICIES, CONTROL)
    plan = interleaved_plan([0.5, 1.5, 2.5, 3.5], duration_s=4.0, segments=4, arms=arms)
    orders = [order for _, _, order in plan]
    assert orders == [arms, arms[1:] + arms[:1], arms[2:] + arms[:2], arms]  # each first once
    from loadtest.compare_batching import arm_env, build_parser

    args = build_parser().parse_args(
        ["--control", "continuous", "--server-env", "MT_A=1", "--arm-env", "control:MT_B=2"]
    )
    assert policy_of(CONTROL, args) == "continuous"
    control_env = policy_env(policy_of(CONTROL, args), 10.0, arm_env(args, CONTROL))
    assert control_env["MT_BATCHING"] == "continuous"
    assert control_env["MT_A"] == "1" and control_env["MT_B"] == "2"
    assert "MT_B" not in arm_env(args, "continuous")
    args = build_parser().parse_args(["--control"])
    assert policy_of(CONTROL, args) == "static"
    for malformed in ("control", "control:MT_B", ":MT_B=2", "control:=2"):
        with pytest.raises(SystemExit):
            build_parser().parse_args(["--control", "--arm-env", malformed])
    with pytest.raises(SystemExit):  # no such arm in this run
        compare_main(["--arm-env", "control:MT_B=2", "--spawn-server", "unused"])

    stub = f"{sys.executable} -m loadtest.stub_server --port {{port}} --base-ms 1"
    argv = ["--spawn-server", "unused", "--server-command", stub, "--rate", "20", "--control"]
    argv += ["--duration", "1", "--interleave", "3", "--warmup", "0.25", "--no-plot"]
    assert compare_main(argv + ["--results-dir", str(tmp_path), "--name", "aa"]) == 0
    out = capsys.readouterr().out
    warmed = re.findall(r"(\w+): warmed up", out)
    assert sorted(warmed) == ["continuous", "control", "static"]
    document = json.loads((tmp_path / "aa.json").read_text())
    assert document["config"]["control"] == "static"
    schedule = poisson_schedule(20, duration_s=1, seed=0)
    for arm in arms:
        assert [r["index"] for r in document["runs"][arm]["records"]] == list(range(len(schedule)))
    p99 = document["comparison"]["p99_ms"]
    assert p99["control/static"] == pytest.approx(p99[CONTROL] / p99["static"], abs=1e-3)
    assert "control/static" in out


def test_control_code_serves_the_control_arm_from_another_checkout(tmp_path, capsys):
    """An A/B of code in one run: the control's service starts in the other checkout (here a
    stand-in whose stub marks that it ran there), the other two in this one."""
    from loadtest.compare_batching import main as compare_main

    checkout = tmp_path / "checkout"
    (checkout / "service").mkdir(parents=True)
    (checkout / "loadtest").mkdir()
    (checkout / "loadtest" / "__init__.py").write_text("")
    real_stub = Path(__file__).resolve().parents[2] / "loadtest" / "stub_server.py"
    (checkout / "loadtest" / "stub_server.py").write_text(
        "import pathlib, runpy\n"
        "pathlib.Path('served-here').write_text('yes')\n"
        f"runpy.run_path({str(real_stub)!r}, run_name='__main__')\n"
    )
    stub = f"{sys.executable} -m loadtest.stub_server --port {{port}} --base-ms 1"
    argv = ["--spawn-server", "unused", "--server-command", stub, "--rate", "20", "--control"]
    argv += ["--duration", "1", "--interleave", "2", "--warmup", "0", "--no-plot"]
    argv += ["--results-dir", str(tmp_path / "out"), "--name", "code"]
    assert compare_main([*argv, "--control-code", str(checkout)]) == 0
    assert (checkout / "served-here").read_text() == "yes"
    assert not (Path(__file__).resolve().parents[2] / "served-here").exists()
    document = json.loads((tmp_path / "out" / "code.json").read_text())
    assert document["config"]["control_code"] == {"path": str(checkout.resolve()), "revision": None}
    assert all(r["status"] == 200 for r in document["runs"]["control"]["records"])
    with pytest.raises(SystemExit):  # no arm to serve it without --control
        compare_main(["--spawn-server", "unused", "--control-code", str(checkout)])
    with pytest.raises(SystemExit):  # not a checkout of the service
        compare_main(["--spawn-server", "unused", "--control", "--control-code", str(tmp_path)])
