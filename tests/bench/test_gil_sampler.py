"""bench/gil_sampler.py reads py-spy's raw output, and bench/request_stages.py charges its
stacks to stages by the same rules as its in-process sampler."""

from __future__ import annotations

from bench.gil_sampler import parse_raw, stage_shares
from bench.request_stages import LOOP_C, split_event_loop_again, stage_of_frames

LOOP = "Runner.run (asyncio/runners.py:118)"
ROUTE = "DirectRoutes.__call__ (service/web/direct.py:121)"
RAW = "\n".join(
    [
        f"thread (101): MainThread;<module> (service/__main__.py:107);{LOOP} 30",
        f"thread (101): MainThread;{LOOP};{ROUTE};StreamHandler.emit (logging/__init__.py:1113) 10",
        f"thread (101): MainThread;{LOOP};{ROUTE};Encode (sentencepiece/__init__.py:281) 5",
        f"thread (101): MainThread;{LOOP};{ROUTE};sentence_spans (service/text/segmenter.py:88) 15",
        f"thread (101): MainThread;{LOOP};{ROUTE} 40",
        "thread (102): engine-loop;EngineLoop.run (service/scheduling/engine_loop.py:57) 99",
        "py-spy> a line that is not a stack",
    ]
)


def test_raw_lines_parse_into_thread_frames_and_counts() -> None:
    stacks = parse_raw(RAW)
    assert len(stacks) == 6
    thread, frames, count = stacks[1]
    assert (thread, count) == ("MainThread", 10)
    assert frames[0] == ("Runner.run", "asyncio/runners.py")
    assert frames[-1] == ("StreamHandler.emit", "logging/__init__.py")


def test_stacks_are_charged_by_the_in_process_rules() -> None:
    shares = stage_shares(parse_raw(RAW), "MainThread", stage_of_frames)
    assert shares == {
        LOOP_C: 0.30,  # the loop runner innermost: uvloop's C code
        "logging": 0.10,  # logging outranks the route it is called from
        "tokenization": 0.05,
        "splitting & protection": 0.15,
        "web: routes, middleware, admission": 0.40,
    }


def test_the_event_loop_split_is_replaced_and_the_engine_split_kept() -> None:
    profile = {
        "by_stage": {"decoder steps": 4.0, "tokenization": 0.5, "logging": 0.5},
        "by_thread": {"event loop": 1.0, "engine-loop": 4.0},
        "by_thread_stage": {
            "event loop": {"tokenization": 0.5, "logging": 0.5},
            "engine-loop": {"decoder steps": 4.0},
        },
    }
    split_event_loop_again(profile, parse_raw(RAW))
    assert profile["by_stage_in_process"]["tokenization"] == 0.5
    by_stage = profile["by_stage"]
    assert by_stage["decoder steps"] == 4.0
    assert abs(by_stage["tokenization"] - 0.05) < 1e-9
    assert abs(by_stage["web: routes, middleware, admission"] - 0.40) < 1e-9
    assert abs(sum(by_stage.values()) - 5.0) < 1e-9  # the threads' CPU, split differently
    assert profile["event_loop_split"]["samples"] == 100


def test_a_frame_name_broken_over_two_lines_loses_only_that_stack():
    stacks = parse_raw(f"thread (101): MainThread;{LOOP};weird (\nname) (x.py:1) 3\n{RAW}")
    assert len(stacks) == 6
    assert sum(count for _, _, count in stacks) == 30 + 10 + 5 + 15 + 40 + 99
