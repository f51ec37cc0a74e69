"""The per-request limits and decoding defaults (``MT_MAX_TEXTS_PER_REQUEST`` ...
``MT_TRANSLATION_CACHE_SIZE``), and the decoding options a request's choices become.

The text pipeline (service/text/pipeline.py), the translator and the dispatcher take the
``TextLimits`` object itself; service/config.py reads it from the environment as part of
``Settings``. Every refusal names its environment variable.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field

from service.errors import InputTooLarge, InvalidInput


@dataclass(frozen=True)
class DecodingOptions:
    beam_size: int
    max_new_tokens: int | None  # None: proportional to each sentence's length
    length_penalty: float
    # A document job's sentences: the batcher admits them after interactive ones, a few rows
    # at a time (service/scheduling/chooser.py). Changes no output.
    background: bool = False


class TextLimits(BaseModel):
    """Per-request limits."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    max_texts_per_request: int = Field(
        64, ge=1, description="Most texts in one request (413 above it)."
    )
    max_chars_per_text: int = Field(
        5000, ge=1, description="Most characters in one text (413 above it)."
    )
    max_input_tokens: int = Field(
        256, ge=8, description="Longest sentence in tokens after splitting."
    )
    max_new_tokens: int = Field(
        256, ge=1, description="Upper bound on generated tokens per sentence."
    )
    output_length_ratio: float = Field(
        2.0,
        gt=0,
        description="When a request gives no max_new_tokens, a sentence may generate "
        "ratio x its source tokens + output_length_slack tokens (at most max_new_tokens): "
        "a model that never emits eos must not hold a row for max_new_tokens steps.",
    )
    output_length_slack: int = Field(10, ge=1, description="See output_length_ratio.")
    length_penalty: float = Field(1.0, ge=0, description="Beam search length penalty (exponent).")
    max_beam_size: int = Field(8, ge=1, description="Largest beam a request may ask for.")
    default_beam_size: int = Field(1, ge=1, description="Beam of a request that names none.")
    request_timeout_s: float = Field(
        60.0,
        gt=0,
        description="One deadline for a translation request, however many models it passes.",
    )
    translation_cache_size: int = Field(
        0,
        ge=0,
        description="Sentences kept in an LRU cache of finished translations (keyed by the "
        "sentence and the decoding options); 0 turns the cache off.",
    )

    def options(self, beam_size: int | None, max_new_tokens: int | None) -> DecodingOptions:
        """Request options with defaults filled in, checked against the limits."""
        beam_size = beam_size if beam_size is not None else self.default_beam_size
        if beam_size > self.max_beam_size:
            raise InvalidInput(
                "beam_size_too_large",
                f"beam_size {beam_size} is above the limit MT_MAX_BEAM_SIZE={self.max_beam_size}",
            )
        if max_new_tokens is not None and max_new_tokens > self.max_new_tokens:
            raise InvalidInput(
                "max_new_tokens_too_large",
                f"max_new_tokens {max_new_tokens} is above the limit "
                f"MT_MAX_NEW_TOKENS={self.max_new_tokens}",
            )
        return DecodingOptions(beam_size, max_new_tokens, self.length_penalty)

    def check_request_size(self, texts: Sequence[str]) -> None:
        """Texts per request and characters per text (before any model is involved)."""
        if not texts:
            raise InvalidInput("no_texts", "text must hold at least one text")
        if len(texts) > self.max_texts_per_request:
            raise InputTooLarge(
                "too_many_texts",
                f"{len(texts)} texts is above the limit "
                f"MT_MAX_TEXTS_PER_REQUEST={self.max_texts_per_request}",
            )
        for index, text in enumerate(texts):
            if len(text) > self.max_chars_per_text:
                raise InputTooLarge(
                    "text_too_long",
                    f"text {index} has {len(text)} characters; the limit is "
                    f"MT_MAX_CHARS_PER_TEXT={self.max_chars_per_text}",
                )
