"""The synchronous text work around a model: limits, sentences, placeholders, tokens, joining.

No HTTP and no asyncio here: the service (service/translation/translator.py), the evaluation
(models/training/evaluate.py) and offline scripts all translate through these functions, so
what is scored is what is served. Refusals are domain errors (:class:`InputTooLarge`,
:class:`InvalidInput`); the web layer maps them to 413 and 422.

For each text: split it into sentences (service/text/segmenter.py) over the placeholder-masked
text, so no boundary falls inside a URL, tag or format field; keep markup tags at a
sentence's edges out of the model; mask the sentence's placeholders (service/text/protection.py:
the model was trained on sentences whose symbols are numbered from 0); tokenize. After
decoding: strip eos/pad, detokenize, restore the placeholders, put the edge tags back and join
the sentences with the whitespace they had.

A translation memory (service/storage/memories.py), where the request has one, is asked
first: for the whole text, then for each sentence as it is and without the markup at its
edges. A segment it knows is written as approved and never reaches the model (nor the
cache, nor the glossary: an approved translation is final).

Choices that a client sees (documented in docs/text-handling.md):

* empty or whitespace-only text is returned unchanged and never reaches the model; so is a
  sentence with nothing to translate (only placeholders, punctuation or symbols: "%s",
  "<br/>", "—");
* a sentence longer than ``MT_MAX_INPUT_TOKENS`` tokens (or the model's positions) is refused
  (it is not cut: a translation of half a sentence is silently wrong);
* every limit error names its environment variable.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence

from service.errors import InputTooLarge
from service.text.glossary import Glossary, GlossaryError
from service.text.limits import DecodingOptions, TextLimits
from service.text.placeholders import (
    EXACT_SYMBOL_RE,
    SYMBOL_OPEN,
    find_placeholders,
    protect,
    restore,
)
from service.text.plans import (
    CacheLookup,
    DecodeRows,
    MemoryLookup,
    SentencePlan,
    TextHandling,
    TextPlan,
    TextTranslation,
    TranslationBatch,
)
from service.text.protection import RunProtector, placeholder_token_ids, space_out_formatting
from service.text.segmenter import SentenceSplit, join_translations, one_line, sentence_spans
from service.text.tokenizer import Tokenizer


class TextPipeline:
    """One model's text handling: its tokenizer, source language and limits."""

    def __init__(
        self,
        tokenizer: Tokenizer,
        limits: TextLimits,
        source_lang: str = "en",
        model_positions: int | None = None,
    ) -> None:
        """``model_positions``: the model's position table size; longer sources cannot be
        encoded, so the sentence limit is the smaller of it and ``MT_MAX_INPUT_TOKENS``."""
        self.tokenizer = tokenizer
        self.limits = limits
        self.source_lang = source_lang
        self.max_input_tokens = min(limits.max_input_tokens, model_positions or 1 << 30)
        self.symbol_ids = placeholder_token_ids(tokenizer)
        self.protector = RunProtector(tokenizer)  # what the model cannot spell

    # --- before the model ---------------------------------------------------------------

    def plan(
        self,
        texts: Sequence[str],
        options: DecodingOptions,
        cached: CacheLookup | None = None,
        glossary: Glossary | None = None,
        memory: MemoryLookup | None = None,
        handling: TextHandling = TextHandling(),
    ) -> list[TextPlan]:
        """Sentences of every text, masked and tokenized; those known without the model
        (nothing to translate, ``memory`` or ``cached`` knows them) already carry their
        translation. ``glossary``: its terms are masked like placeholders and come back as
        their target terms (service/text/glossary.py). ``handling``: where sentences end,
        and whether translations keep the source's formatting."""
        if glossary is not None and not self.protector.symbols:
            # Enforcement is the copy constraint on ｟k｠ symbols; without them a term could
            # only be hoped for, and a glossary that silently does nothing is worse than a
            # refusal.
            raise GlossaryError(
                "glossary_unsupported",
                "this model's vocabulary has no placeholder symbols, which glossaries need",
            )
        plans = []
        for text_index, text in enumerate(texts):
            if memory is not None and (approved := memory(text)) is not None:
                plans.append(_approved_text(text, approved))
                continue
            # Split the masked text, so that no boundary falls inside a URL, tag or
            # format field; then mask each sentence on its own (symbols numbered from 0).
            masked_text, text_originals = protect(text)
            spans = sentence_spans(masked_text, self.source_lang, handling.split)
            spans = self.protector.cut_around_runs(masked_text, spans)  # models without ｟k｠
            # The gaps between spans are whitespace (and, for a model without symbols, runs
            # it cannot spell), the same in the masked text as in the original, so joining
            # over the masked text keeps them.
            plan = TextPlan(text=masked_text, spans=spans)
            for start, end in spans:
                sentence_text = restore(masked_text[start:end], text_originals)
                if handling.split is not SentenceSplit.LINES_AND_PUNCTUATION:
                    sentence_text = one_line(sentence_text)
                sentence = self.prepare_sentence(
                    sentence_text, text_index, options, cached, glossary, memory, handling
                )
                plan.sentences.append(sentence)
            plans.append(plan)
        return plans

    def prepare_sentence(
        self,
        text: str,
        text_index: int,
        options: DecodingOptions,
        cached: CacheLookup | None = None,
        glossary: Glossary | None = None,
        memory: MemoryLookup | None = None,
        handling: TextHandling = TextHandling(),
    ) -> SentencePlan:
        prefix, core, suffix = split_edge_tags(text)
        if memory is not None and (
            approved := _approved_sentence(text, prefix, core, suffix, memory)
        ):
            return approved
        terms = glossary.matches(core, find_placeholders(core)) if glossary is not None else []
        masked, originals = self.protector.protect(core, terms)
        masked, glued = space_out_formatting(masked, originals)
        sentence = SentencePlan(
            masked=masked, originals=originals, prefix=prefix, suffix=suffix, glued=glued
        )
        if handling.preserve_formatting:
            sentence.formatting_source = core
        if not has_words(masked):
            # Nothing a model could translate: the text as it was, but with glossary terms
            # (a sentence that is one term) written as their targets.
            sentence.translation = f"{prefix}{restore(masked, originals)}{suffix}"
            return sentence
        if _finished_from_cache(sentence, options, cached):
            return sentence
        src_ids = self.tokenizer.encode_one(masked)
        if len(src_ids) > self.max_input_tokens:
            limit = f"MT_MAX_INPUT_TOKENS={self.limits.max_input_tokens}"
            if self.max_input_tokens < self.limits.max_input_tokens:
                limit = f"{self.max_input_tokens}, the model's positions ({limit})"
            raise InputTooLarge(
                "sentence_too_long",
                f"a sentence of text {text_index} has {len(src_ids)} tokens; the limit is "
                f"{limit} (sentence starts: {text[:60]!r})",
            )
        self._set_source(sentence, src_ids, options)
        return sentence

    def continue_sentence(
        self, previous: SentencePlan, options: DecodingOptions, cached: CacheLookup | None = None
    ) -> SentencePlan:
        """The second leg of a pivot: ``previous`` (translated by the first model) as this
        model's source. The intermediate stays masked, so placeholders cross both legs as
        symbols under the copy constraint and are restored once, with the original values;
        edge tags go back at the end. An intermediate too long for this model's positions is
        cut there (it came from a model, not from the client)."""
        masked = previous.masked_translation
        assert masked is not None, "only a sentence the first model translated continues"
        sentence = SentencePlan(
            masked=masked,
            originals=previous.originals,
            prefix=previous.prefix,
            suffix=previous.suffix,
            formatting_source=previous.formatting_source,
            glued=previous.glued,
        )
        if not has_words(masked):
            sentence.translation = previous.translation
            return sentence
        if _finished_from_cache(sentence, options, cached):
            return sentence
        src_ids = self.tokenizer.encode_one(masked)
        if len(src_ids) > self.max_input_tokens:
            src_ids = src_ids[: self.max_input_tokens - 1] + [self.tokenizer.eos_id]
        self._set_source(sentence, src_ids, options)
        return sentence

    def _set_source(
        self, sentence: SentencePlan, src_ids: Sequence[int], options: DecodingOptions
    ) -> None:
        sentence.src_ids = tuple(src_ids)
        sentence.copy_tokens = copy_tokens_for(src_ids, self.symbol_ids)
        sentence.max_new_tokens = self.max_new_tokens(len(src_ids), options)

    def max_new_tokens(self, src_len: int, options: DecodingOptions) -> int:
        if options.max_new_tokens is not None:
            return options.max_new_tokens
        limits = self.limits
        proportional = math.ceil(limits.output_length_ratio * src_len)
        return min(limits.max_new_tokens, proportional + limits.output_length_slack)

    # --- after the model ----------------------------------------------------------------

    def finish(self, sentence: SentencePlan, output_ids: Sequence[int]) -> None:
        """Detokenize the model's ids for ``sentence`` (eos and pad dropped) and restore."""
        tokens = [t for t in output_ids if t not in (self.tokenizer.eos_id, self.tokenizer.pad_id)]
        sentence.finish(self.tokenizer.decode(tokens), len(tokens))

    def hypothesis_text(self, sentence: SentencePlan, output_ids: Sequence[int]) -> str:
        """What :meth:`finish` would make of ``output_ids`` for ``sentence``, leaving the
        sentence alone (for the n-best alternatives of beam search)."""
        tokens = [t for t in output_ids if t not in (self.tokenizer.eos_id, self.tokenizer.pad_id)]
        restored = sentence.restored(self.tokenizer.decode(tokens))
        return f"{sentence.prefix}{sentence.formatted(restored)}{sentence.suffix}"

    @staticmethod
    def assemble(plans: list[TextPlan], decoded: int) -> TranslationBatch:
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
            memory_sentences=sum(s.from_memory for s in sentences),
        )

    def translate(
        self,
        texts: Sequence[str],
        options: DecodingOptions,
        decode_rows: DecodeRows,
        glossary: Glossary | None = None,
        memory: MemoryLookup | None = None,
    ) -> TranslationBatch:
        """The whole pipeline, synchronously: ``decode_rows`` runs the model on the
        sentences that need it (evaluation and offline scripts; the service awaits the
        batcher instead, between :meth:`plan` and :meth:`finish`)."""
        self.limits.check_request_size(texts)
        plans = self.plan(texts, options, glossary=glossary, memory=memory)
        to_decode = [s for plan in plans for s in plan.sentences if s.needs_model]
        if to_decode:
            outputs = decode_rows(to_decode, options)
            for sentence, output_ids in zip(to_decode, outputs, strict=True):
                self.finish(sentence, output_ids)
        return self.assemble(plans, decoded=len(to_decode))


# --- pieces --------------------------------------------------------------------------------


def copy_tokens_for(src_ids: Sequence[int], symbol_ids: frozenset[int]) -> dict[int, int] | None:
    """The decoding constraint of a source: every symbol id -> how often the source has it
    (0 for the others: the model may not invent them). None when the vocabulary has none."""
    if not symbol_ids:
        return None
    if symbol_ids.isdisjoint(src_ids):
        return dict.fromkeys(symbol_ids, 0)  # the usual source: no symbol, none may be invented
    counts = Counter(token for token in src_ids if token in symbol_ids)
    return {token: counts[token] for token in symbol_ids}


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


def _approved_text(text: str, approved: str) -> TextPlan:
    """A text the memory knows whole: one segment, its whitespace at the ends kept."""
    start = len(text) - len(text.lstrip())
    end = len(text.rstrip())
    sentence = SentencePlan(masked="", originals=[], translation=approved, from_memory=True)
    return TextPlan(text=text, spans=[(start, end)], sentences=[sentence])


def _approved_sentence(
    text: str, prefix: str, core: str, suffix: str, memory: MemoryLookup
) -> SentencePlan | None:
    """The sentence as the memory has it: as it is, or its words without the markup at its
    edges (the markup then goes back around the approved translation)."""
    approved = memory(text)
    if approved is None and (prefix or suffix):
        found = memory(core)
        approved = f"{prefix}{found}{suffix}" if found is not None else None
    if approved is None:
        return None
    return SentencePlan(masked="", originals=[], translation=approved, from_memory=True)


def _finished_from_cache(
    sentence: SentencePlan, options: DecodingOptions, cached: CacheLookup | None
) -> bool:
    """Finish ``sentence`` from the translation cache where it has it; whether it did."""
    if cached is None or (hit := cached(sentence.masked, options)) is None:
        return False
    sentence.finish(*hit)
    sentence.from_cache = True
    return True


def has_words(masked: str) -> bool:
    """Whether anything but placeholder symbols, punctuation and symbols is left."""
    without_symbols = EXACT_SYMBOL_RE.sub("", masked) if SYMBOL_OPEN in masked else masked
    return any(char.isalnum() for char in without_symbols)
