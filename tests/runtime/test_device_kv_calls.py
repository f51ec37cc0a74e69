"""Session calls per step on the device cache path (DeviceKV, here on the CPU provider).

On a GPU the host work per step bounds the step (issue 53), and every session call is host work:
IO binding and a run. With the device decoder (export/device_decoder.py) a step where no row
joins is one call, beam reorders included; a step where rows leave adds one helper call (the
cross caches' gather). An export written before the device decoder still decodes the same
tokens with the helper graphs (decoder plus ``kv_append`` every step)."""

from __future__ import annotations

import os
import shutil
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest

from service.runtime.contract import DEVICE_DECODER_FILE
from service.runtime.device_kv import PendingGather
from service.runtime.engine import Engine
from service.runtime.onnx_model import cuda_is_usable
from service.runtime.types import DecodeRequest
from tests.onnx_helpers import padded_sources, reference

pytest_plugins = ["tests.onnx_fixtures"]  # the session-scoped `exported` fixture

MAX_NEW = 12


class CountedSession:
    """An InferenceSession whose runs are logged by name (everything else passes through)."""

    def __init__(self, session: Any, name: str, log: list[str]) -> None:
        self.session, self.name, self.log = session, name, log

    def run_with_iobinding(self, *args: Any, **kwargs: Any) -> Any:
        self.log.append(self.name)
        return self.session.run_with_iobinding(*args, **kwargs)

    def run(self, *args: Any, **kwargs: Any) -> Any:
        self.log.append(self.name)
        return self.session.run(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.session, name)


def counted_engine(onnx_dir, provider: str = "cpu") -> tuple[Engine, list[str]]:
    """A device-cache engine whose every session call lands in the log."""
    engine = Engine.from_dir(onnx_dir, provider=provider, intra_op_threads=1, kv_backend="device")
    log: list[str] = []
    model, kv = engine.model, engine.kv
    model.decoder = CountedSession(model.decoder, "decoder", log)
    model.encoder = CountedSession(model.encoder, "encoder", log)
    for name in ("kv_select", "kv_merge", "kv_append"):
        if (session := getattr(kv, name)) is not None:
            setattr(kv, name, CountedSession(session, name, log))
    return engine, log


def decode_counting_calls(engine: Engine, log: list[str], requests: list[DecodeRequest]):
    """Add ``requests`` (one group) and step until they finish: the tokens by request id and,
    per step, (session calls, whether rows left, whether a pending gather moves rows)."""
    engine.add(requests)
    assert engine.groups == 1
    tokens, steps = {}, []
    while engine.active_requests:
        del log[:]
        finished = engine.step()
        tokens.update({done.request_id: done.tokens for done in finished})
        cache = engine.group_tensors[0].self_cache if engine.groups else None
        moves = (
            isinstance(cache, PendingGather)
            and not (cache.rows == np.arange(len(cache.rows))).all()
        )
        steps.append((list(log), bool(finished), moves))
    return tokens, steps


@pytest.mark.parametrize("provider", ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)])
def test_a_step_is_one_decoder_call_and_rows_leaving_add_one_helper(exported, provider):
    """Greedy and beam-4 requests of one group, one stopping early: every step without a row
    leaving is the decoder call alone (beam reorders included), a step where rows leave is
    the decoder and one helper, and so is the first (beam searches run one row, then their
    beams share its cross keys and values: the gather that encoding made before); the tokens
    are the reference search's, each sentence alone."""
    if provider == "cuda" and not (
        "CUDAExecutionProvider" in ort.get_available_providers()
        and cuda_is_usable(exported.onnx_dir / "kv_select.onnx")
    ):
        pytest.skip("no usable CUDA execution provider")
    engine, log = counted_engine(exported.onnx_dir, provider)
    assert engine.kv.folds and engine.kv.kv_append is None
    # The random test model stops at once on sources 0 and 1, and runs to the limit on 2 and 3.
    _, _, sources = padded_sources(exported.model, [7, 6, 8, 9], seed=31)
    requests = [
        DecodeRequest("greedy", sources[2], 1, MAX_NEW),
        DecodeRequest("beam", sources[3], 4, MAX_NEW),
        DecodeRequest("short beam", sources[2], 4, 3),
        DecodeRequest("stops at once", sources[0], 4, MAX_NEW),
    ]
    tokens, steps = decode_counting_calls(engine, log, requests)
    for index, (calls, rows_left, _) in enumerate(steps):
        if rows_left or index == 0:
            assert calls[0] == "decoder" and set(calls[1:]) <= {"kv_select"} and len(calls) <= 2
        else:
            assert calls == ["decoder"]
    # the run is meaningful: beams reordered on steps without a helper call, rows left early
    assert any(moves and not rows_left for _, rows_left, moves in steps)
    assert any(rows_left for _, rows_left, _ in steps[:-1])
    for request in requests:
        source, beam, limit = request.src_ids, request.beam_size, request.max_new_tokens
        assert tokens[request.request_id] == reference(exported.model, [source], beam, limit)[0]


@pytest.fixture(scope="module")
def old_export(exported, tmp_path_factory):
    """The export as written before the device decoder: no decoder_device.onnx."""
    target = tmp_path_factory.mktemp("old_export") / "fp32"
    shutil.copytree(exported.onnx_dir, target, ignore=shutil.ignore_patterns(DEVICE_DECODER_FILE))
    return target


@pytest.mark.parametrize("beam_size", [1, 4])
def test_an_export_without_the_device_decoder_decodes_with_the_helper_graphs(
    exported, old_export, beam_size
):
    engine, log = counted_engine(old_export)
    assert not engine.kv.folds and engine.model.decoder_file == "decoder.onnx"
    _, _, sources = padded_sources(exported.model, [7, 6, 8, 9], seed=31)
    requests = [DecodeRequest(i, sources[i], beam_size, MAX_NEW) for i in (0, 2, 3)]
    tokens, steps = decode_counting_calls(engine, log, requests)
    steady = [calls for calls, rows_left, _ in steps if not rows_left]
    assert steady and all(calls[:2] == ["decoder", "kv_append"] for calls in steady)
    for i in (0, 2, 3):
        assert tokens[i] == reference(exported.model, [sources[i]], beam_size, MAX_NEW)[0]


def test_a_device_decoder_older_than_the_decoder_is_not_used(exported, tmp_path):
    """A tool that rewrote decoder.onnx alone left a device decoder of another graph."""
    target = tmp_path / "rewritten"
    shutil.copytree(exported.onnx_dir, target)
    decoder = target / "decoder.onnx"
    stamp = decoder.stat().st_mtime
    os.utime(target / DEVICE_DECODER_FILE, (stamp - 60, stamp - 60))
    engine = Engine.from_dir(target, provider="cpu", kv_backend="device")
    assert engine.model.decoder_file == "decoder.onnx" and not engine.kv.folds
    os.utime(target / DEVICE_DECODER_FILE, (stamp, stamp))
    engine = Engine.from_dir(target, provider="cpu", kv_backend="device")
    assert engine.model.decoder_file == DEVICE_DECODER_FILE and engine.kv.folds
