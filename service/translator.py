"""Texts in, texts out: limits, sentence splitting, placeholders, tokens, the batcher.

For each text: split it into sentences (service/segmenter.py), mask placeholders per
sentence (service/placeholders.py: the model was trained on sentences whose symbols are
numbered from 0), tokenize, and hand every sentence of the request to the batcher at once
(one row per sentence and beam). Back come token ids per sentence: detokenize, restore the
placeholders and join the sentences with the whitespace they had.

Choices that a client sees (documented in the README's API section):

* empty or whitespace-only text is returned unchanged and never reaches the model; so is a
  sentence with nothing to translate (only placeholders, punctuation or symbols: "%s",
  "<br/>", "—");
* a sentence longer than ``MT_MAX_INPUT_TOKENS`` tokens is refused with 413 (it is not cut:
  a translation of half a sentence is silently wrong);
* every limit error names its environment variable.
"""

from __future__ import annotations

import asyncio
import math
import re
from collections import Counter, OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field

from service.batcher import ContinuousBatcher, RowRequest
from service.placeholders import (
    PLACEHOLDER_SYMBOLS,
    SYMBOL_CLOSE,
    SYMBOL_OPEN,
    find_placeholders,
    protect,
    restore,
)
from service.segmenter import join_translations, sentence_spans
from service.settings import Settings
from service.tokenizer import Tokenizer

# Tokenizing is quick, but a request at the limits (64 texts x 5000 characters) would hold
# the event loop for a noticeable time: such requests tokenize in a worker thread.
_TOKENIZE_IN_THREAD_CHARS = 20_000
_SYMBOL_RE = re.compile(rf"{SYMBOL_OPEN}\d+{SYMBOL_CLOSE}")


def placeholder_token_ids(tokenizer: Tokenizer) -> frozenset[int]:
    """Ids of the placeholder symbols that the vocabulary has as single pieces, the same id on
    the source and the target side (``encode`` gives it, ``decode`` turns it back into the
    symbol); others are left out of the constraint."""
    ids = set()
    for symbol in PLACEHOLDER_SYMBOLS:
        candidates = [i for i in tokenizer.encode_one(symbol) if tokenizer.decode([i]) == symbol]
        if len(candidates) == 1:
            ids.add(candidates[0])
    return frozenset(ids)


def copy_tokens_for(src_ids: Sequence[int], symbol_ids: frozenset[int]) -> dict[int, int] | None:
    """The decoding constraint of a source: every symbol id -> how often the source has it
    (0 for the others: the model may not invent them). None when the vocabulary has none."""
    if not symbol_ids:
        return None
    counts = Counter(token for token in src_ids if token in symbol_ids)
    return {token: counts[token] for token in symbol_ids}


class ApiError(Exception):
    """A refusal with an HTTP status, a machine-readable code and a message for people."""

    def __init__(
        self, status_code: int, code: str, message: str, headers: dict[str, str] | None = None
    ) -> None:
        super().__init__(message)
        self.status_code = status_code
        self.code = code
        self.message = message
        self.headers = headers


@dataclass(frozen=True)
class DecodingOptions:
    beam_size: int
    max_new_tokens: int | None  # None: proportional to each sentence's length
    length_penalty: float


@dataclass
class _Sentence:
    masked: str  # what the model sees: placeholders replaced by ｟k｠ symbols
    originals: list[str]
    prefix: str = ""  # tags (and spaces) before the words, kept out of the model
    suffix: str = ""
    src_ids: tuple[int, ...] = ()
    copy_tokens: dict[int, int] | None = None  # placeholder constraint of the decoding
    translation: str | None = None  # set when known without the model (passthrough, cache)
    output_tokens: int = 0
    from_cache: bool = False

    def finish(self, masked_translation: str, output_tokens: int) -> None:
        self.output_tokens = output_tokens
        restored = restore(masked_translation, self.originals)
        self.translation = f"{self.prefix}{restored}{self.suffix}"


@dataclass
class _TextPlan:
    text: str
    spans: list[tuple[int, int]]
    sentences: list[_Sentence] = field(default_factory=list)


@dataclass(frozen=True)
class TextTranslation:
    text: str
    output_tokens: int
    sentences: int


@dataclass(frozen=True)
class TranslationBatch:
    translations: list[TextTranslation]
    input_tokens: int
    output_tokens: int
    decoded_sentences: int
    cached_sentences: int


class TranslationCache:
    """LRU of sentence translations keyed by the masked sentence and the decoding options.

    Correct because decoding is deterministic and does not depend on the batch
    (DESIGN.md, decision 6). Used from the event loop only, so it needs no lock.
    """

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._entries: OrderedDict[tuple, tuple[str, int]] = OrderedDict()

    def get(self, key: tuple) -> tuple[str, int] | None:
        entry = self._entries.get(key)
        if entry is not None:
            self._entries.move_to_end(key)
        return entry

    def put(self, key: tuple, value: tuple[str, int]) -> None:
        self._entries[key] = value
        self._entries.move_to_end(key)
        while len(self._entries) > self.capacity:
            self._entries.popitem(last=False)


class Translator:
    def __init__(
        self,
        tokenizer: Tokenizer,
        batcher: ContinuousBatcher,
        settings: Settings,
        source_lang: str = "en",
        model_positions: int | None = None,
    ) -> None:
        """``model_positions``: the model's position table size; longer sources cannot be
        encoded, so the sentence limit is the smaller of it and ``MT_MAX_INPUT_TOKENS``."""
        self.max_input_tokens = min(settings.max_input_tokens, model_positions or 1 << 30)
        self.metrics = batcher.metrics
        self.tokenizer = tokenizer
        self.symbol_ids = placeholder_token_ids(tokenizer)
        self.batcher = batcher
        self.settings = settings
        self.source_lang = source_lang
        self.cache = (
            TranslationCache(settings.translation_cache_size)
            if settings.translation_cache_size > 0
            else None
        )

    def options(self, beam_size: int | None, max_new_tokens: int | None) -> DecodingOptions:
        """Request options with defaults filled in, checked against the limits."""
        limits = self.settings
        beam_size = beam_size if beam_size is not None else limits.default_beam_size
        if beam_size > limits.max_beam_size:
            raise ApiError(
                422,
                "beam_size_too_large",
                f"beam_size {beam_size} is above the limit MT_MAX_BEAM_SIZE={limits.max_beam_size}",
            )
        if max_new_tokens is not None and max_new_tokens > limits.max_new_tokens:
            raise ApiError(
                422,
                "max_new_tokens_too_large",
                f"max_new_tokens {max_new_tokens} is above the limit "
                f"MT_MAX_NEW_TOKENS={limits.max_new_tokens}",
            )
        return DecodingOptions(beam_size, max_new_tokens, limits.length_penalty)

    async def translate(self, texts: Sequence[str], options: DecodingOptions) -> TranslationBatch:
        """Translate ``texts`` (order kept). Raises :class:`ApiError` for the limits, and
        whatever the batcher raises (queue full, shutting down, timeout)."""
        self._check_request_size(texts)
        if sum(map(len, texts)) > _TOKENIZE_IN_THREAD_CHARS:
            plans = await asyncio.to_thread(self._plan, texts, options)
        else:
            plans = self._plan(texts, options)
        to_decode = [s for plan in plans for s in plan.sentences if s.translation is None]
        if len(to_decode) > self.batcher.max_queue:
            raise ApiError(
                413,
                "too_many_sentences",
                f"the request has {len(to_decode)} sentences; the queue holds at most "
                f"MT_MAX_QUEUE={self.batcher.max_queue}",
            )
        rows = [
            RowRequest(
                src_ids=sentence.src_ids,
                beam_size=options.beam_size,
                max_new_tokens=self._max_new_tokens(len(sentence.src_ids), options),
                length_penalty=options.length_penalty,
                copy_tokens=sentence.copy_tokens,
            )
            for sentence in to_decode
        ]
        results = await self.batcher.submit(rows, timeout_s=self.settings.request_timeout_s)
        for sentence, result in zip(to_decode, results, strict=True):
            tokens = [
                t for t in result.tokens if t not in (self.tokenizer.eos_id, self.tokenizer.pad_id)
            ]
            masked_translation = self.tokenizer.decode(tokens)
            if self.cache is not None:
                self.cache.put(
                    self._cache_key(sentence, options), (masked_translation, len(tokens))
                )
            sentence.finish(masked_translation, len(tokens))
        return self._assemble(plans, decoded=len(to_decode))

    # --- helpers -------------------------------------------------------------------------

    def _check_request_size(self, texts: Sequence[str]) -> None:
        limits = self.settings
        if not texts:
            raise ApiError(422, "no_texts", "text must hold at least one text")
        if len(texts) > limits.max_texts_per_request:
            raise ApiError(
                413,
                "too_many_texts",
                f"{len(texts)} texts is above the limit "
                f"MT_MAX_TEXTS_PER_REQUEST={limits.max_texts_per_request}",
            )
        for index, text in enumerate(texts):
            if len(text) > limits.max_chars_per_text:
                raise ApiError(
                    413,
                    "text_too_long",
                    f"text {index} has {len(text)} characters; the limit is "
                    f"MT_MAX_CHARS_PER_TEXT={limits.max_chars_per_text}",
                )

    def _plan(self, texts: Sequence[str], options: DecodingOptions) -> list[_TextPlan]:
        plans = []
        for text_index, text in enumerate(texts):
            # Split the masked text, so that no boundary falls inside a URL, tag or
            # format field; then mask each sentence on its own (symbols numbered from 0).
            masked_text, text_originals = protect(text)
            spans = sentence_spans(masked_text, self.source_lang)
            # The gaps between spans are whitespace, the same in the masked text as in the
            # original, so joining over the masked text keeps the original whitespace.
            plan = _TextPlan(text=masked_text, spans=spans)
            for start, end in spans:
                sentence_text = restore(masked_text[start:end], text_originals)
                plan.sentences.append(self._prepare_sentence(sentence_text, text_index, options))
            plans.append(plan)
        return plans

    def _prepare_sentence(self, text: str, text_index: int, options: DecodingOptions) -> _Sentence:
        prefix, core, suffix = split_edge_tags(text)
        masked, originals = protect(core)
        sentence = _Sentence(masked=masked, originals=originals, prefix=prefix, suffix=suffix)
        if not _has_words(masked):
            sentence.translation = text  # nothing a model could translate
            return sentence
        if self.cache is not None and (hit := self.cache.get(self._cache_key(sentence, options))):
            sentence.finish(*hit)
            sentence.from_cache = True
            self.metrics.cache_hits.inc()
            return sentence
        src_ids = self.tokenizer.encode_one(masked)
        if len(src_ids) > self.max_input_tokens:
            limit = f"MT_MAX_INPUT_TOKENS={self.settings.max_input_tokens}"
            if self.max_input_tokens < self.settings.max_input_tokens:
                limit = f"{self.max_input_tokens}, the model's positions ({limit})"
            raise ApiError(
                413,
                "sentence_too_long",
                f"a sentence of text {text_index} has {len(src_ids)} tokens; the limit is "
                f"{limit} (sentence starts: {text[:60]!r})",
            )
        sentence.src_ids = tuple(src_ids)
        sentence.copy_tokens = copy_tokens_for(src_ids, self.symbol_ids)
        return sentence

    def _max_new_tokens(self, src_len: int, options: DecodingOptions) -> int:
        if options.max_new_tokens is not None:
            return options.max_new_tokens
        proportional = math.ceil(self.settings.output_length_ratio * src_len)
        return min(self.settings.max_new_tokens, proportional + self.settings.output_length_slack)

    @staticmethod
    def _cache_key(sentence: _Sentence, options: DecodingOptions) -> tuple:
        return (sentence.masked, options.beam_size, options.max_new_tokens, options.length_penalty)

    def _assemble(self, plans: list[_TextPlan], decoded: int) -> TranslationBatch:
        translations = []
        for plan in plans:
            parts = [sentence.translation or "" for sentence in plan.sentences]
            translations.append(
                TextTranslation(
                    text=join_translations(plan.text, plan.spans, parts),
                    output_tokens=sum(s.output_tokens for s in plan.sentences),
                    sentences=len(plan.sentences),
                )
            )
        sentences = [s for plan in plans for s in plan.sentences]
        return TranslationBatch(
            translations=translations,
            input_tokens=sum(len(s.src_ids) for s in sentences),
            output_tokens=sum(s.output_tokens for s in sentences if not s.from_cache),
            decoded_sentences=decoded,
            cached_sentences=sum(s.from_cache for s in sentences),
        )


def split_edge_tags(text: str) -> tuple[str, str, str]:
    """``(prefix, core, suffix)``: markup tags (and spaces) that open or close a sentence
    stay out of the model and go back verbatim (``<b>Save</b>`` → ``<b>`` + model("Save") +
    ``</b>``), so wrapping markup survives whatever the model does with symbols. Format
    fields (``{0}``, ``%s``) stay in the core even at its edges: they are parts of the
    sentence whose position the translation may change. Text without a word outside the
    tags is all core."""
    spans = [(start, end) for start, end in find_placeholders(text) if text[start] == "<"]
    start = 0
    for span_start, span_end in spans:
        if text[start:span_start].strip():
            break
        start = span_end
    end = len(text)
    for span_start, span_end in reversed(spans):
        if span_end <= start or text[span_end:end].strip():
            break
        end = span_start
    core = text[start:end].strip()
    if not core:
        return "", text, ""
    core_start = text.index(core, start)
    return text[:core_start], core, text[core_start + len(core) :]


def _has_words(masked: str) -> bool:
    """Whether anything but placeholder symbols, punctuation and symbols is left."""
    without_symbols = _SYMBOL_RE.sub("", masked)
    return any(char.isalnum() for char in without_symbols)
