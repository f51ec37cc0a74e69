"""Reference greedy and beam search in PyTorch, on the model's KV-cached incremental API.

These are the ground truth the ONNX Runtime engine is tested against, and they are themselves
tested against Hugging Face ``generate``. Beam search follows ``transformers``' semantics
exactly (2K candidates per step, length-normalised finished hypotheses, the
``early_stopping=False`` stopping heuristic), so outputs can be compared token for token.

Outputs are token lists without the decoder start token and without the final eos.
The pad token is never generated (OPUS-MT configs ban it via ``bad_words_ids``).
"""

from __future__ import annotations

import torch
from torch import Tensor

from models.transformer import Transformer


def _next_log_probs(logits: Tensor, pad_id: int, suppress_ids: tuple[int, ...] = ()) -> Tensor:
    """logits (N, 1, V) -> log-probabilities (N, V) with the pad token banned.

    ``suppress_ids`` are banned too (transformers' ``suppress_tokens``, which like
    ``bad_words_ids`` acts on the log-probabilities): the serving engine bans the unknown token."""
    log_probs = torch.log_softmax(logits[:, -1].float(), dim=-1)
    log_probs[:, [pad_id, *suppress_ids]] = float("-inf")
    return log_probs


@torch.no_grad()
def greedy_search(
    model: Transformer,
    src_ids: Tensor,
    src_mask: Tensor,
    max_new_tokens: int = 64,
    suppress_ids: tuple[int, ...] = (),
    forced_first_ids: Tensor | None = None,
) -> list[list[int]]:
    """src_ids, src_mask (B, S) -> B token lists.

    ``forced_first_ids`` (B,): each row's first generated token, whatever the model prefers
    (M2M-100 / NLLB's target-language code; transformers' ``forced_bos_token_id``). It stays
    in the row's output, as in ``generate``'s."""
    config = model.config
    batch = src_ids.shape[0]
    _, cross_keys, cross_values = model.encode(src_ids, src_mask)
    past_keys, past_values = model.empty_cache(batch, src_ids.device)
    device = src_ids.device  # the model's: validation during GPU training decodes there
    tokens = torch.full((batch, 1), config.decoder_start_id, dtype=torch.long, device=device)
    outputs: list[list[int]] = [[] for _ in range(batch)]
    finished = torch.zeros(batch, dtype=torch.bool, device=device)
    for step in range(max_new_tokens):
        positions = torch.full((batch, 1), step, dtype=torch.long, device=device)
        logits, past_keys, past_values = model.decode_step(
            tokens, positions, past_keys, past_values, cross_keys, cross_values, src_mask
        )
        next_tokens = _next_log_probs(logits, config.pad_id, suppress_ids).argmax(dim=-1)  # (B,)
        if step == 0 and forced_first_ids is not None:
            next_tokens = forced_first_ids.to(device)  # (B,)
        next_token_list = next_tokens.tolist()
        for row in (~finished).nonzero().flatten().tolist():
            if next_token_list[row] != config.eos_id:
                outputs[row].append(next_token_list[row])
        finished |= next_tokens == config.eos_id
        if finished.all():
            break
        tokens = next_tokens[:, None]
    return outputs


@torch.no_grad()
def beam_search(
    model: Transformer,
    src_ids: Tensor,
    src_mask: Tensor,
    beam_size: int = 4,
    max_new_tokens: int = 64,
    length_penalty: float = 1.0,
    suppress_ids: tuple[int, ...] = (),
) -> list[list[int]]:
    """src_ids, src_mask (B, S) -> the best hypothesis per sentence (B token lists)."""
    config = model.config
    batch, num_beams = src_ids.shape[0], beam_size
    eos = config.eos_id

    # Every sentence's encoder output is shared by its K beams: rows are (B*K), sentence-major.
    _, cross_keys, cross_values = model.encode(src_ids, src_mask)
    cross_keys = tuple(k.repeat_interleave(num_beams, dim=0) for k in cross_keys)
    cross_values = tuple(v.repeat_interleave(num_beams, dim=0) for v in cross_values)
    beam_src_mask = src_mask.repeat_interleave(num_beams, dim=0)
    past_keys, past_values = model.empty_cache(batch * num_beams, src_ids.device)

    running_tokens = torch.zeros(batch, num_beams, 0, dtype=torch.long)  # (B, K, t)
    running_scores = torch.full((batch, num_beams), -1e9)  # (B, K) summed log-probs
    running_scores[:, 0] = 0.0  # all beams start identical: keep one alive
    finished: list[list[tuple[float, list[int]]]] = [[] for _ in range(batch)]
    still_improvable = [True] * batch
    input_ids = torch.full((batch * num_beams, 1), config.decoder_start_id, dtype=torch.long)

    for step in range(max_new_tokens):
        positions = torch.full((batch * num_beams, 1), step, dtype=torch.long)
        logits, past_keys, past_values = model.decode_step(
            input_ids, positions, past_keys, past_values, cross_keys, cross_values, beam_src_mask
        )
        log_probs = _next_log_probs(logits, config.pad_id, suppress_ids)  # (B*K, V)
        vocab = log_probs.shape[-1]
        candidate_scores = (
            log_probs.view(batch, num_beams, vocab) + running_scores[:, :, None]
        ).view(batch, num_beams * vocab)
        top_scores, top_index = candidate_scores.topk(2 * num_beams, dim=-1)  # (B, 2K)
        top_beam, top_token = top_index // vocab, top_index % vocab
        length = step + 1  # generated tokens including the one chosen now
        ends = (top_token == eos) | (length == max_new_tokens)

        # Candidates ranked within the top K that end here become finished hypotheses.
        for sentence in range(batch):
            if not still_improvable[sentence]:
                continue
            for rank in range(num_beams):
                if ends[sentence, rank]:
                    beam = int(top_beam[sentence, rank].item())
                    hypothesis = running_tokens[sentence, beam].tolist()
                    if top_token[sentence, rank].item() != eos:
                        hypothesis.append(top_token[sentence, rank].item())
                    score = top_scores[sentence, rank].item() / length**length_penalty
                    finished[sentence].append((score, hypothesis))
            finished[sentence].sort(key=lambda item: item[0], reverse=True)
            del finished[sentence][num_beams:]

        # The best K candidates that do not end continue.
        open_scores = top_scores - 1e9 * ends.float()
        keep_scores, keep_rank = open_scores.topk(num_beams, dim=-1)  # (B, K)
        keep_beam = top_beam.gather(1, keep_rank)
        keep_token = top_token.gather(1, keep_rank)
        running_tokens = torch.cat(
            [
                running_tokens.gather(1, keep_beam[:, :, None].expand(-1, -1, step)),
                keep_token[:, :, None],
            ],
            dim=2,
        )
        running_scores = keep_scores
        source_rows = (keep_beam + torch.arange(batch)[:, None] * num_beams).flatten()  # (B*K,)
        past_keys = tuple(k.index_select(0, source_rows) for k in past_keys)
        past_values = tuple(v.index_select(0, source_rows) for v in past_values)
        input_ids = keep_token.reshape(-1, 1)

        # transformers' early_stopping=False heuristic: stop once the best running beam,
        # normalised at its current length, cannot beat the worst of K finished hypotheses.
        for sentence in range(batch):
            best_running = running_scores[sentence, 0].item() / length**length_penalty
            full = len(finished[sentence]) == num_beams
            worst_finished = finished[sentence][-1][0] if full else -1e9
            still_improvable[sentence] &= best_running > worst_finished
        if not any(still_improvable):
            break

    return [hypotheses[0][1] if hypotheses else [] for hypotheses in finished]
