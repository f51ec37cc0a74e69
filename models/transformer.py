"""An encoder-decoder transformer for translation, written for incremental (KV-cached) decoding.

Shapes: B batch, S source length, T new target tokens, P cached target tokens, D d_model,
H heads, Dh = D / H head size, V vocabulary.

The public surface is what export traces and what the search reference calls:

- ``encode(src_ids, src_mask) -> (memory, cross_keys, cross_values)``: the encoder output and,
  for every decoder layer, the cross-attention keys and values ``W_k·memory``, ``W_v·memory``.
  They are computed once per request here; the decoder never recomputes them.
- ``decode_new(...) -> (logits, new_keys, new_values)``: T new tokens against a self-attention
  cache of C slots (any of which the mask may hide), returning only the T new tokens' keys and
  values. This is what the exported decoder computes: the caller keeps the cache and writes the
  new slots into spare capacity, so no step copies the whole cache (docs/engine.md).
- ``decode_step(...) -> (logits, present_keys, present_values)``: the same, with the cache grown
  to C + T (the reference search and the parity checks).
- ``forward(src_ids, src_mask, tgt_ids)``: full-sequence training pass, the same code path with
  an empty cache.

Parameter names follow Hugging Face's Marian so checkpoint import is a renaming. The config
also covers M2M-100 / NLLB-200 (pre-norm with final layer norms, ReLU, one tied table, fairseq
positions): one model, switched by ``TransformerConfig``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from models.config import TransformerConfig

KVCache = tuple[Tensor, ...]  # one (B, H, P, Dh) tensor per decoder layer


def sinusoidal_positions(num_positions: int, dim: int) -> Tensor:
    """Marian's sinusoidal table: sines in the first half of each vector, cosines in the second."""
    positions = torch.arange(num_positions, dtype=torch.float64)[:, None]  # (N, 1)
    inverse_freq = 10000.0 ** (-torch.arange(0, dim, 2, dtype=torch.float64) / dim)  # (ceil(D/2),)
    angles = positions * inverse_freq  # (N, ceil(D/2))
    table = torch.cat([angles.sin(), angles.cos()[:, : dim // 2]], dim=1)  # (N, D)
    return table.float()


def fairseq_positions(num_positions: int, dim: int, pad_id: int) -> Tensor:
    """fairseq's sinusoidal table (M2M-100, NLLB): frequencies log(10000)/(half_dim - 1), sines
    then cosines, a zero column for an odd D, and the pad row zeroed. Computed in float32 as
    fairseq and transformers compute it, so an imported checkpoint sees the table it was
    trained with to the last bit."""
    half_dim = dim // 2
    step = math.log(10000) / (half_dim - 1)
    inverse_freq = torch.exp(torch.arange(half_dim, dtype=torch.float32) * -step)  # (D/2,)
    angles = torch.arange(num_positions, dtype=torch.float32)[:, None] * inverse_freq  # (N, D/2)
    table = torch.cat([angles.sin(), angles.cos()], dim=1)  # (N, 2 * (D // 2))
    if dim % 2:
        table = torch.cat([table, torch.zeros(num_positions, 1)], dim=1)  # (N, D)
    table[pad_id] = 0.0
    return table


def additive_mask(keep: Tensor, dtype: torch.dtype) -> Tensor:
    """Boolean keep-mask -> additive bias: 0 where attention is allowed, a large negative elsewhere."""
    allowed = torch.zeros((), dtype=dtype, device=keep.device)
    hidden = torch.full((), torch.finfo(dtype).min, dtype=dtype, device=keep.device)
    return torch.where(keep, allowed, hidden)  # exported: one Where, no zeros tensor to fill


ACTIVATIONS: dict[str, Callable[[Tensor], Tensor]] = {
    "relu": F.relu,
    "gelu": F.gelu,
    "swish": F.silu,
}


class MultiHeadAttention(nn.Module):
    """Scaled dot-product attention over H heads.

    Q, K and V are each one D x D projection whose output is split logically into H heads of
    size Dh; the heads' outputs are concatenated back to D and projected by ``out_proj``.
    """

    # Buffers that ``fuse_for_export`` registers and ``unfuse`` drops.
    fused_q_weight: Tensor
    fused_q_bias: Tensor
    fused_qkv_weight: Tensor
    fused_qkv_bias: Tensor

    def __init__(self, d_model: int, num_heads: int, dropout: float) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = d_model // num_heads
        self.dropout = dropout
        self.q_proj = nn.Linear(d_model, d_model)
        self.k_proj = nn.Linear(d_model, d_model)
        self.v_proj = nn.Linear(d_model, d_model)
        self.out_proj = nn.Linear(d_model, d_model)
        self.written_out = False  # attention as explicit matmuls (export), else SDPA

    @property
    def scale(self) -> float:
        return 1.0 / math.sqrt(self.head_dim)  # the head size, not the sequence length

    def fuse_for_export(self) -> None:
        """Constants the one-token export path multiplies by (``attend_cached``, ``forward``):
        the query projection pre-scaled by 1/sqrt(Dh), and Q, K, V stacked into one (3D, D)
        projection. Buffers, so the ONNX export stores them as initializers (a quantizer sees
        plain MatMul weights); ``unfuse`` drops them again."""
        with torch.no_grad():
            q_weight, q_bias = self.q_proj.weight * self.scale, self.q_proj.bias * self.scale
            qkv_weight = torch.cat([q_weight, self.k_proj.weight, self.v_proj.weight])  # (3D, D)
            qkv_bias = torch.cat([q_bias, self.k_proj.bias, self.v_proj.bias])  # (3D,)
        self.register_buffer("fused_q_weight", q_weight, persistent=False)  # (D, D)
        self.register_buffer("fused_q_bias", q_bias, persistent=False)  # (D,)
        self.register_buffer("fused_qkv_weight", qkv_weight, persistent=False)
        self.register_buffer("fused_qkv_bias", qkv_bias, persistent=False)

    def unfuse(self) -> None:
        for name in ("fused_q_weight", "fused_q_bias", "fused_qkv_weight", "fused_qkv_bias"):
            self._buffers.pop(name, None)

    def one_token_path(self, query_states: Tensor) -> bool:
        """Export of a decoder step (T = 1, a constant when tracing) with fused constants."""
        return self.written_out and query_states.shape[1] == 1 and "fused_q_weight" in self._buffers

    def split_heads(self, x: Tensor) -> Tensor:
        batch, length, _ = x.shape
        if length == 1:  # the same tensor; exported without a Transpose node
            return x.view(batch, self.num_heads, 1, self.head_dim)  # (B, H, 1, Dh)
        return x.view(batch, length, self.num_heads, self.head_dim).transpose(1, 2)  # (B, H, L, Dh)

    def project_keys_values(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """(B, L, D) -> keys, values (B, H, L, Dh)."""
        return self.split_heads(self.k_proj(x)), self.split_heads(self.v_proj(x))

    def forward(self, query_states: Tensor, keys: Tensor, values: Tensor, bias: Tensor) -> Tensor:
        """query_states (B, T, D); keys, values (B, H, L, Dh); bias (B, 1, T, L) additive."""
        if self.one_token_path(query_states):  # pre-scaled query projection
            queries = self.split_heads(
                F.linear(query_states, self.fused_q_weight, self.fused_q_bias)
            )  # (B, H, 1, Dh)
            scores = queries @ keys.transpose(-2, -1) + bias  # (B, H, 1, L)
            return self.merge_heads(scores.softmax(dim=-1) @ values)
        scale = self.scale
        queries = self.split_heads(self.q_proj(query_states))  # (B, H, T, Dh)
        if self.written_out:
            # For export (export/onnx_export.py sets it): ONNX Runtime folds the keys'
            # transpose into the matmul (FusedMatMul, transB). Exported, SDPA transposes every
            # layer's whole self-attention cache and cross keys at every decoder step (19 %
            # of a Marian-base step at 32 rows, measured with ORT's profiler).
            scores = (queries * scale) @ keys.transpose(-2, -1) + bias  # (B, H, T, L)
            attended = scores.softmax(dim=-1) @ values  # (B, H, T, Dh)
        else:
            attended = F.scaled_dot_product_attention(
                queries,
                keys,
                values,
                attn_mask=bias,
                dropout_p=self.dropout if self.training else 0.0,
                scale=scale,
            )  # (B, H, T, Dh)
        return self.merge_heads(attended)

    def merge_heads(self, attended: Tensor) -> Tensor:
        """(B, H, T, Dh) -> (B, T, D), then the output projection."""
        batch, _, length, _ = attended.shape
        if length == 1:  # the same tensor; exported without a Transpose node
            merged = attended.reshape(batch, 1, self.num_heads * self.head_dim)
        else:
            merged = attended.transpose(1, 2).reshape(batch, length, self.num_heads * self.head_dim)
        return self.out_proj(merged)

    def attend_cached(
        self, query_states: Tensor, past_keys: Tensor, past_values: Tensor, bias: Tensor
    ) -> tuple[Tensor, Tensor, Tensor]:
        """Self-attention of T new tokens over a cache and themselves.

        query_states (B, T, D); past (B, H, C, Dh); bias (B, 1, T, C+T). Returns the output
        (B, T, D) and the new tokens' keys and values (B, H, T, Dh).
        """
        if not self.one_token_path(query_states):  # eager: attention over the concatenation
            new_keys, new_values = self.project_keys_values(query_states)  # (B, H, T, Dh)
            keys = torch.cat([past_keys, new_keys], dim=2)  # (B, H, C+T, Dh)
            values = torch.cat([past_values, new_values], dim=2)
            return self(query_states, keys, values, bias), new_keys, new_values
        # One token, exported: the cache is never concatenated with the new key (the graph
        # would copy the whole cache every step): the scores against each are computed apart
        # and only they, (B, H, 1, C+1), are joined; the new token's own score and value are
        # elementwise (a batched matmul of B*H products of 1 x Dh by Dh x 1 costs more in ONNX
        # Runtime). One stacked Q/K/V projection, and no Transpose nodes: T = 1 makes
        # (B, 1, H, Dh) and (B, H, 1, Dh) the same memory.
        batch = query_states.shape[0]
        qkv = F.linear(query_states, self.fused_qkv_weight, self.fused_qkv_bias)  # (B, 1, 3D)
        queries, new_keys, new_values = qkv.view(batch, 3 * self.num_heads, 1, self.head_dim).split(
            self.num_heads, dim=1
        )  # 3 x (B, H, 1, Dh), queries pre-scaled
        past_scores = queries @ past_keys.transpose(-2, -1)  # (B, H, 1, C)
        new_scores = (queries * new_keys).sum(-1, keepdim=True)  # (B, H, 1, 1)
        weights = (torch.cat([past_scores, new_scores], dim=-1) + bias).softmax(dim=-1)
        capacity = past_keys.shape[2]
        attended = weights[..., :capacity] @ past_values + weights[..., capacity:] * new_values
        return self.merge_heads(attended), new_keys, new_values  # (B, 1, D)


class FeedForward(nn.Module):
    def __init__(
        self, d_model: int, ffn_dim: int, activation: str, activation_dropout: float
    ) -> None:
        super().__init__()
        self.fc1 = nn.Linear(d_model, ffn_dim)
        self.fc2 = nn.Linear(ffn_dim, d_model)
        self.activation = ACTIVATIONS[activation]
        self.activation_dropout = nn.Dropout(activation_dropout)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc2(self.activation_dropout(self.activation(self.fc1(x))))


class Sublayer(nn.Module):
    """Residual connection around a sublayer, with its layer norm before (pre-norm) or after."""

    def __init__(self, d_model: int, normalize_before: bool, dropout: float, eps: float) -> None:
        super().__init__()
        self.layer_norm = nn.LayerNorm(d_model, eps=eps)
        self.normalize_before = normalize_before
        self.dropout = nn.Dropout(dropout)

    def normalize_input(self, x: Tensor) -> Tensor:
        return self.layer_norm(x) if self.normalize_before else x

    def add_residual(self, x: Tensor, sublayer_output: Tensor) -> Tensor:
        x = x + self.dropout(sublayer_output)
        return x if self.normalize_before else self.layer_norm(x)


class EncoderLayer(nn.Module):
    def __init__(self, config: TransformerConfig) -> None:
        super().__init__()
        d, pre, drop, eps = (
            config.d_model,
            config.normalize_before,
            config.dropout,
            config.layer_norm_eps,
        )
        self.self_attn = MultiHeadAttention(d, config.encoder_heads, config.attention_dropout)
        self.self_attn_sublayer = Sublayer(d, pre, drop, eps)
        self.feed_forward = FeedForward(
            d, config.encoder_ffn_dim, config.activation, config.activation_dropout
        )
        self.feed_forward_sublayer = Sublayer(d, pre, drop, eps)

    def forward(self, x: Tensor, src_bias: Tensor) -> Tensor:
        """x (B, S, D); src_bias (B, 1, S, S) hides padding keys."""
        h = self.self_attn_sublayer.normalize_input(x)
        keys, values = self.self_attn.project_keys_values(h)
        x = self.self_attn_sublayer.add_residual(x, self.self_attn(h, keys, values, src_bias))
        h = self.feed_forward_sublayer.normalize_input(x)
        return self.feed_forward_sublayer.add_residual(x, self.feed_forward(h))


class DecoderLayer(nn.Module):
    def __init__(self, config: TransformerConfig) -> None:
        super().__init__()
        d, pre, drop, eps = (
            config.d_model,
            config.normalize_before,
            config.dropout,
            config.layer_norm_eps,
        )
        self.self_attn = MultiHeadAttention(d, config.decoder_heads, config.attention_dropout)
        self.self_attn_sublayer = Sublayer(d, pre, drop, eps)
        self.encoder_attn = MultiHeadAttention(d, config.decoder_heads, config.attention_dropout)
        self.encoder_attn_sublayer = Sublayer(d, pre, drop, eps)
        self.feed_forward = FeedForward(
            d, config.decoder_ffn_dim, config.activation, config.activation_dropout
        )
        self.feed_forward_sublayer = Sublayer(d, pre, drop, eps)

    def forward(
        self,
        x: Tensor,
        self_bias: Tensor,
        past_keys: Tensor,
        past_values: Tensor,
        cross_keys: Tensor,
        cross_values: Tensor,
        cross_bias: Tensor,
    ) -> tuple[Tensor, Tensor, Tensor]:
        """x (B, T, D); self_bias (B, 1, T, C+T); past (B, H, C, Dh); cross (B, H, S, Dh);
        cross_bias (B, 1, T, S). Returns x and the T new tokens' keys and values (B, H, T, Dh)."""
        h = self.self_attn_sublayer.normalize_input(x)
        attended, new_keys, new_values = self.self_attn.attend_cached(
            h, past_keys, past_values, self_bias
        )  # (B, T, D), (B, H, T, Dh) x 2
        x = self.self_attn_sublayer.add_residual(x, attended)
        h = self.encoder_attn_sublayer.normalize_input(x)
        x = self.encoder_attn_sublayer.add_residual(
            x, self.encoder_attn(h, cross_keys, cross_values, cross_bias)
        )
        h = self.feed_forward_sublayer.normalize_input(x)
        x = self.feed_forward_sublayer.add_residual(x, self.feed_forward(h))
        return x, new_keys, new_values


class Transformer(nn.Module):
    position_table: Tensor  # a buffer (N, D)

    def __init__(self, config: TransformerConfig) -> None:
        super().__init__()
        self.config = config
        d = config.d_model
        self.embed_scale = math.sqrt(d) if config.scale_embedding else 1.0
        self.src_embed = nn.Embedding(config.src_vocab_size, d, padding_idx=config.pad_id)
        self.tgt_embed = (
            self.src_embed
            if config.share_embeddings
            else nn.Embedding(config.tgt_vocab_size, d, padding_idx=config.pad_id)
        )
        if config.positions == "fairseq":
            # Row pad_id is the pad tokens' zero row; tokens count from pad_id + 1, so the table
            # needs pad_id + 1 rows more than max_positions.
            self.position_offset = config.pad_id + 1
            table = fairseq_positions(config.max_positions + self.position_offset, d, config.pad_id)
        else:
            self.position_offset = 0
            table = sinusoidal_positions(config.max_positions, d)
        self.register_buffer("position_table", table, persistent=False)  # (N, D)
        self.embed_dropout = nn.Dropout(config.dropout)
        self.encoder_layers = nn.ModuleList(
            EncoderLayer(config) for _ in range(config.encoder_layers)
        )
        self.decoder_layers = nn.ModuleList(
            DecoderLayer(config) for _ in range(config.decoder_layers)
        )
        # Pre-norm stacks end with a layer norm; post-norm stacks are already normalised.
        final_norm = lambda: nn.LayerNorm(d, eps=config.layer_norm_eps)  # noqa: E731
        self.encoder_final_norm = final_norm() if config.normalize_before else nn.Identity()
        self.decoder_final_norm = final_norm() if config.normalize_before else nn.Identity()
        self.output_projection = (
            None if config.tie_output else nn.Linear(d, config.tgt_vocab_size, bias=False)
        )
        self.final_logits_bias = (
            nn.Parameter(torch.zeros(1, config.tgt_vocab_size))
            if config.final_logits_bias
            else None
        )
        self.apply(self._init_weights)

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, nn.Linear):
            nn.init.xavier_uniform_(module.weight)
            nn.init.zeros_(module.bias) if module.bias is not None else None
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, std=module.embedding_dim**-0.5)
            if module.padding_idx is not None:
                nn.init.zeros_(module.weight[module.padding_idx])

    # --- embeddings ------------------------------------------------------------------------

    def embed(self, table: nn.Embedding, ids: Tensor, positions: Tensor) -> Tensor:
        """ids, positions (B, L) -> (B, L, D)."""
        x = table(ids) * self.embed_scale + self.position_table[positions]
        return self.embed_dropout(x)

    def source_positions(self, src_ids: Tensor) -> Tensor:
        """Rows of the position table for src_ids (B, S)."""
        batch, src_len = src_ids.shape
        if self.config.positions == "fairseq":
            # fairseq numbers the non-pad tokens from pad_id + 1 and sends pad to its zero row;
            # it reads pad off the ids (not a mask), and so does this, to number as it does.
            non_pad = (src_ids != self.config.pad_id).long()  # (B, S)
            return torch.cumsum(non_pad, dim=1) * non_pad + self.config.pad_id  # (B, S)
        return torch.arange(src_len, device=src_ids.device).expand(batch, src_len)  # (B, S)

    # --- encoder ---------------------------------------------------------------------------

    def encode(self, src_ids: Tensor, src_mask: Tensor) -> tuple[Tensor, KVCache, KVCache]:
        """src_ids, src_mask (B, S), mask 1 for tokens and 0 for padding.

        Returns memory (B, S, D) and, per decoder layer, cross keys and values (B, H, S, Dh).
        """
        batch, src_len = src_ids.shape
        x = self.embed(self.src_embed, src_ids, self.source_positions(src_ids))  # (B, S, D)
        keep = src_mask.bool()[:, None, None, :].expand(batch, 1, src_len, src_len)
        src_bias = additive_mask(keep, x.dtype)  # (B, 1, S, S)
        for layer in self.encoder_layers:
            x = layer(x, src_bias)
        memory = self.encoder_final_norm(x)
        cross = [
            cast(DecoderLayer, layer).encoder_attn.project_keys_values(memory)
            for layer in self.decoder_layers
        ]
        cross_keys = tuple(keys for keys, _ in cross)
        cross_values = tuple(values for _, values in cross)
        return memory, cross_keys, cross_values

    # --- decoder ---------------------------------------------------------------------------

    def empty_cache(
        self, batch: int, device: torch.device | None = None
    ) -> tuple[KVCache, KVCache]:
        """Self-attention caches of length 0 for the first decoder step."""
        shape = (batch, self.config.decoder_heads, 0, self.config.decoder_head_dim)
        empty = tuple(torch.zeros(shape, device=device) for _ in self.decoder_layers)
        return empty, tuple(torch.zeros(shape, device=device) for _ in self.decoder_layers)

    def decode_step(
        self,
        input_ids: Tensor,
        positions: Tensor,
        past_keys: KVCache,
        past_values: KVCache,
        cross_keys: KVCache,
        cross_values: KVCache,
        src_mask: Tensor,
        self_mask: Tensor | None = None,
    ) -> tuple[Tensor, KVCache, KVCache]:
        """``decode_new``, returning logits (B, T, V) and the caches grown to P + T."""
        logits, new_keys, new_values = self.decode_new(
            input_ids, positions, past_keys, past_values, cross_keys, cross_values, src_mask,
            self_mask,
        )  # fmt: skip
        grow = lambda past, new: tuple(  # noqa: E731
            torch.cat([p, n], dim=2) for p, n in zip(past, new, strict=True)
        )
        return logits, grow(past_keys, new_keys), grow(past_values, new_values)

    def decode_new(
        self,
        input_ids: Tensor,
        positions: Tensor,
        past_keys: KVCache,
        past_values: KVCache,
        cross_keys: KVCache,
        cross_values: KVCache,
        src_mask: Tensor,
        self_mask: Tensor | None = None,
    ) -> tuple[Tensor, KVCache, KVCache]:
        """Run T new target tokens against a cache of P slots.

        input_ids (B, T); positions (B, T), each new token's index among its row's target tokens
        (0 for the start token) whichever table the config names; past (B, H, P, Dh) per layer;
        cross (B, H, S, Dh) per layer; src_mask (B, S); self_mask (B, P+T), 1 where a cache slot
        or new position holds a real token (rows that joined a running batch late have invalid
        slots on the left, and spare capacity at the right end is invalid for every row),
        default all 1.
        Returns logits (B, T, V) and the new tokens' keys and values (B, H, T, Dh) per layer.
        """
        batch, new_len = input_ids.shape
        past_len = past_keys[0].shape[2]
        total_len = past_len + new_len
        if self_mask is None:
            self_mask = torch.ones(batch, total_len, dtype=torch.long, device=input_ids.device)
        self_keep = self_mask.bool()[:, None, None, :]  # (B, 1, 1, P+T)
        if new_len > 1:
            # Query t sits at cache index P + t and may see cache indices j <= P + t (one new
            # token sees them all: the exported step graph has no causal part).
            key_index = torch.arange(total_len, device=input_ids.device)  # (P+T,)
            query_index = torch.arange(new_len, device=input_ids.device) + past_len  # (T,)
            causal = key_index[None, :] <= query_index[:, None]  # (T, P+T)
            self_keep = causal[None, None, :, :] & self_keep  # (B, 1, T, P+T)
        cross_keep = src_mask.bool()[:, None, None, :]  # (B, 1, 1, S), broadcast over T

        if self.position_offset:
            # ``positions`` counts a row's earlier target tokens (its past_len + step; the
            # decoder never feeds pad), and fairseq's first target token sits at pad_id + 1.
            positions = positions + self.position_offset  # (B, T)
        x = self.embed(self.tgt_embed, input_ids, positions)  # (B, T, D)
        self_bias = additive_mask(self_keep, x.dtype)
        cross_bias = additive_mask(cross_keep, x.dtype)
        new_keys, new_values = [], []
        for layer, past_k, past_v, cross_k, cross_v in zip(
            self.decoder_layers, past_keys, past_values, cross_keys, cross_values, strict=True
        ):
            x, keys, values = layer(x, self_bias, past_k, past_v, cross_k, cross_v, cross_bias)
            new_keys.append(keys)
            new_values.append(values)
        logits = self.project_to_vocab(self.decoder_final_norm(x))  # (B, T, V)
        return logits, tuple(new_keys), tuple(new_values)

    def project_to_vocab(self, x: Tensor) -> Tensor:
        weight = (
            self.tgt_embed.weight
            if self.output_projection is None
            else self.output_projection.weight
        )
        logits = x @ weight.T  # (B, T, V)
        return logits if self.final_logits_bias is None else logits + self.final_logits_bias

    # --- training --------------------------------------------------------------------------

    def forward(self, src_ids: Tensor, src_mask: Tensor, tgt_ids: Tensor) -> Tensor:
        """Teacher-forced logits (B, T, V) for decoder inputs tgt_ids (B, T) (start token first)."""
        _, cross_keys, cross_values = self.encode(src_ids, src_mask)
        batch, tgt_len = tgt_ids.shape
        positions = torch.arange(tgt_len, device=tgt_ids.device).expand(batch, tgt_len)
        past_keys, past_values = self.empty_cache(batch, tgt_ids.device)
        logits, _, _ = self.decode_new(
            tgt_ids, positions, past_keys, past_values, cross_keys, cross_values, src_mask
        )
        return logits
