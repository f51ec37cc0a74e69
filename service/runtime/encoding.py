"""Newcomers encoded: validated, cut into length classes, each class one group of its own.

A length class (service/runtime/placement.py, ``length_classes``) runs in the encoder calls
that cost least (``encoder_calls``); the calls' groups join into one. Nothing here touches the
running batch: another thread may encode while the engine thread steps (the batcher's encoder
overlap), and ``Engine.place`` adds the result between two steps.
"""

from __future__ import annotations

import time

import numpy as np

from service.runtime.groups import EncodedRequests, Group, GroupTensors
from service.runtime.kv_cache import KVBackend
from service.runtime.model_io import ModelInfo
from service.runtime.placement import encoder_calls, length_classes
from service.runtime.search import make_search
from service.runtime.step_cost import CallCostModel, EncodePrices, calls_features
from service.runtime.stepping import ActiveRequest
from service.runtime.types import DecodeRequest, RejectedRequest


def encode_requests(
    kv: KVBackend,
    info: ModelInfo,
    requests: list[DecodeRequest],
    length_slack: int,
    encode_cost: CallCostModel,
) -> EncodedRequests:
    """Valid requests encoded, one group per length class (sources within ``length_slack``
    of each other); invalid ones refused with the model's reason."""
    rejected: list[RejectedRequest] = []
    valid: list[DecodeRequest] = []
    for request in requests:
        reason = info.refusal(request)
        if reason is None:
            valid.append(request)
        else:
            rejected.append(RejectedRequest(request.request_id, reason))
    # sorted by source length, cut where lengths stop being similar
    classes = length_classes(valid, source_length, length_slack)
    return EncodedRequests([encode_class(kv, info, c, encode_cost) for c in classes], rejected)


def encode_class(
    kv: KVBackend, info: ModelInfo, requests: list[DecodeRequest], encode_cost: CallCostModel
) -> Group:
    """Requests of similar source length as one group, encoded in the calls that cost least
    (timed whole for the cost model, in wall and in this thread's CPU seconds: the calls
    and the copy that joins them)."""
    started, cpu_started = time.perf_counter(), time.thread_time()
    calls = encoder_calls(requests, source_length, EncodePrices.of(encode_cost))
    group = encode_calls(kv, info, calls)
    encode_cost.observe(
        calls_features([[source_length(r) for r in call] for call in calls]),
        time.perf_counter() - started,
        time.thread_time() - cpu_started,
    )
    return group


def encode_group(kv: KVBackend, info: ModelInfo, requests: list[DecodeRequest]) -> Group:
    """One encoder call for requests of similar source length: a group of their own, with an
    empty self-attention cache (not in the batch yet)."""
    src_len = max(len(request.src_ids) for request in requests)
    input_ids = np.full((len(requests), src_len), info.pad_id, dtype=np.int64)  # (M, S')
    attention_mask = np.zeros((len(requests), src_len), dtype=np.int64)
    for row, request in enumerate(requests):
        input_ids[row, : len(request.src_ids)] = request.src_ids
        attention_mask[row, : len(request.src_ids)] = 1
    cross = kv.encode(input_ids, attention_mask)  # 2L x (M, H, S', Dh)

    newcomers = [
        ActiveRequest(
            request=request,
            search=make_search(request, info),
            src_len=len(request.src_ids),
        )
        for request in requests
    ]
    repeats = np.array([active.num_rows for active in newcomers])
    new_rows = int(repeats.sum())
    if new_rows != len(requests):  # beams share their sentence's cross K/V: repeat rows
        cross = kv.select(cross, np.repeat(np.arange(len(requests)), repeats), 0, src_len)
    return Group(
        kv,
        newcomers,
        GroupTensors(
            self_cache=kv.empty(new_rows),
            cross_cache=cross,
            self_mask=np.zeros((new_rows, 0), dtype=np.int64),
            encoder_mask=np.repeat(attention_mask, repeats, axis=0),  # (R, S')
            next_tokens=np.full(new_rows, info.decoder_start_id, dtype=np.int64),
            positions=np.zeros(new_rows, dtype=np.int64),
        ),
    )


def encode_calls(kv: KVBackend, info: ModelInfo, calls: list[list[DecodeRequest]]) -> Group:
    """A length class encoded in ``calls`` (``placement.encoder_calls``) and joined into one
    group: the narrower calls' cross caches right-padded to the widest, a copy and no encoder
    work."""
    parts = [encode_group(kv, info, call) for call in calls]
    while len(parts) > 1:  # pairwise, so a row is copied about log2(len(calls)) times
        for first, second in zip(parts[::2], parts[1::2], strict=False):
            first.absorb(second)
        parts = parts[::2]
    return parts[0]


def source_length(request: DecodeRequest) -> int:
    return len(request.src_ids)
