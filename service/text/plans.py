"""What the text pipeline (service/text/pipeline.py) plans and returns, as values: a
sentence's plan (what the model sees, what is restored around its output), a text's
sentences, how a request's texts are handled, and the translations it gives back; and the
callables it is handed (cache, translation memory, model)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from service.text.limits import DecodingOptions
from service.text.protection import Glued, restore_every_run, tighten
from service.text.segmenter import SentenceSplit, keep_formatting


@dataclass
class SentencePlan:
    masked: str  # what the model sees: placeholders (and what it cannot spell) as ｟k｠
    originals: list[str]
    prefix: str = ""  # tags (and spaces) before the words, kept out of the model
    suffix: str = ""
    src_ids: tuple[int, ...] = ()
    copy_tokens: dict[int, int] | None = None  # placeholder constraint of the decoding
    max_new_tokens: int = 0  # decoding budget of this sentence
    translation: str | None = None  # set when known without the model (passthrough, cache)
    masked_translation: str | None = None  # the model's output before restoring
    output_tokens: int = 0
    from_cache: bool = False
    from_memory: bool = False  # an approved translation from a translation memory
    # The source whose first letter's case and final punctuation the translation keeps
    # (``TextHandling.preserve_formatting``); None: the model's own.
    formatting_source: str | None = None
    glued: Glued = ()  # formatting symbols spaced out for the model (protection.tighten)

    @property
    def needs_model(self) -> bool:
        return self.translation is None

    def finish(self, masked_translation: str, output_tokens: int) -> None:
        self.masked_translation = masked_translation
        self.output_tokens = output_tokens
        restored = self.formatted(self.restored(masked_translation))
        self.translation = f"{self.prefix}{restored}{self.suffix}"

    def restored(self, masked_translation: str) -> str:
        tight = tighten(masked_translation, self.glued)
        return restore_every_run(tight, self.originals, self.masked)

    def formatted(self, translation: str) -> str:
        if self.formatting_source is None:
            return translation
        return keep_formatting(self.formatting_source, translation)


@dataclass
class TextPlan:
    text: str  # the masked text: its gaps between spans are the original whitespace
    spans: list[tuple[int, int]]
    sentences: list[SentencePlan] = field(default_factory=list)


@dataclass(frozen=True)
class TextHandling:
    """How a request's texts become sentences and how their translations are written
    (DeepL's ``split_sentences`` and ``preserve_formatting``)."""

    split: SentenceSplit = SentenceSplit.LINES_AND_PUNCTUATION
    preserve_formatting: bool = False


@dataclass(frozen=True)
class TextTranslation:
    text: str
    output_tokens: int
    sentences: int
    alternatives: tuple[str, ...] = ()  # other translations from the beam's n-best, if asked


@dataclass(frozen=True)
class TranslationBatch:
    translations: list[TextTranslation]
    input_tokens: int
    output_tokens: int
    decoded_sentences: int
    cached_sentences: int
    memory_sentences: int = 0  # segments written from a translation memory


# A cache lookup: the masked sentence and options -> (masked translation, tokens) or None.
CacheLookup = Callable[[str, DecodingOptions], "tuple[str, int] | None"]
# A translation memory: a segment (any whitespace) -> its approved translation, or None.
MemoryLookup = Callable[[str], "str | None"]
# The model: rows of source ids (with their copy constraints and budgets) -> output ids.
DecodeRows = Callable[[list[SentencePlan], DecodingOptions], list[list[int]]]
