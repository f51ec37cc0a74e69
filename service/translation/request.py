"""One translation request: everything that shapes it, read once at the web edge.

Every API (``/v1``, its stream, LibreTranslate, DeepL, files, document jobs) turns what its
client sent into a :class:`TranslationRequest` and hands it to the one way in,
:meth:`service.translation.dispatch.Dispatcher.translate`, much as vLLM's ``add_request``
takes a prompt with its ``SamplingParams``. Below the web layer nothing reads a client's
spelling again: the codes are canonical from here on (service/translation/languages.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Literal

from service.storage.memories import PAIR_DEFAULT, MemoryChoice
from service.text.glossary import Glossary
from service.text.html import MarkupRules
from service.text.limits import DecodingOptions
from service.text.plans import TextHandling
from service.translation.languages import LanguagePair


class Output(Enum):
    """What comes back, and when."""

    WHOLE = "whole"  # every translation, once all are done
    STREAM = "stream"  # each sentence as it finishes (one direct model), then the whole
    ALTERNATIVES = "alternatives"  # the whole, with other translations from the beam's n-best


class Routing(Enum):
    """How a detected source picks the route of a list of texts."""

    # One detection over all the texts picks one route for all (LibreTranslate's contract).
    ONE_DETECTION = "one_detection"
    # Each text is detected and routed on its own, so that a text's translation does not
    # depend on its neighbours (``/v1``).
    EACH_TEXT = "each_text"


TextFormat = Literal["text", "html"]


@dataclass(frozen=True)
class TranslationRequest:
    """``texts`` from ``languages.source`` into ``languages.target``.

    ``format``: ``html`` translates the text between the tags (service/text/html.py), as
    ``markup`` says tags shape sentences. ``handling``: where sentences end, and whether
    the translation keeps the source's formatting.
    ``alternatives``: with ``Output.ALTERNATIVES``, up to this many other translations per
    text. ``glossary``: terms enforced on the request; a stored one must be for the pair of
    every route the texts take. ``memory``: the translation memory the routes use (by
    default each route's pair default, where it has one)."""

    texts: Sequence[str]
    languages: LanguagePair
    options: DecodingOptions
    format: TextFormat = "text"
    markup: MarkupRules = MarkupRules()
    handling: TextHandling = TextHandling()
    output: Output = Output.WHOLE
    alternatives: int = 0
    glossary: Glossary | None = None
    memory: MemoryChoice = PAIR_DEFAULT
    routing: Routing = Routing.ONE_DETECTION

    def __post_init__(self) -> None:
        if (self.output is Output.ALTERNATIVES) != (self.alternatives > 0):
            raise ValueError("alternatives are counted with Output.ALTERNATIVES, and only there")
        if self.format == "html" and (
            self.output is not Output.WHOLE or self.routing is not Routing.ONE_DETECTION
        ):
            raise ValueError("HTML comes back whole, by one route: its units go in chunks")
