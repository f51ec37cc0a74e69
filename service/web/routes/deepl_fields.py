"""DeepL's request fields, read as DeepL reads them: JSON or form bodies, the closed sets of
values it checks (a value outside one is its 400), and the text options of ``/v2/translate``
turned into the service's own (service/text/html.py, service/text/pipeline.py):

* ``split_sentences``: ``1`` at punctuation and line breaks, ``nonewlines`` at punctuation
  only, ``0`` never (each text is one sentence). Without it, DeepL's defaults: ``1``, or
  ``nonewlines`` with ``tag_handling``.
* ``preserve_formatting``: the translation keeps each sentence's first-letter case and final
  punctuation.
* ``ignore_tags``, ``splitting_tags``, ``non_splitting_tags`` (a list, or comma-separated)
  and ``outline_detection`` (default on): how tags shape sentences under ``tag_handling``.
"""

from __future__ import annotations

from typing import Any

from fastapi import Request

from service.errors import ApiError
from service.text.html import MarkupRules
from service.text.plans import TextHandling
from service.text.segmenter import SentenceSplit
from service.web.deps import json_body, sends_form

FORMALITIES = ("default", "more", "less", "prefer_more", "prefer_less")
# Where DeepL's documented values are a closed set, another value is its 400.
CHOICES = {
    "tag_handling": ("html", "xml"),
    "split_sentences": ("0", "1", "nonewlines"),
    "preserve_formatting": ("0", "1", "true", "false"),
    "outline_detection": ("0", "1", "true", "false"),
}
_FLAGS = ("preserve_formatting", "outline_detection")  # JSON clients send booleans
TAG_LISTS = ("ignore_tags", "splitting_tags", "non_splitting_tags")


async def read_fields(request: Request) -> dict[str, Any]:
    """DeepL clients send JSON or form fields (``text`` and the tag lists repeated for a
    list)."""
    if sends_form(request):
        form = await request.form()
        fields: dict[str, Any] = {key: form.get(key) for key in form}
        for name in ("text", *TAG_LISTS):
            if name in form or name == "text":
                fields[name] = form.getlist(name)
        return fields
    data = await json_body(request)
    if not isinstance(data, dict):
        raise ApiError(400, "invalid_request", "the body must be a JSON object")
    return data


def string_field(fields: dict[str, Any], name: str, required: bool = False) -> str | None:
    value = fields.get(name)
    if value is None or value == "":
        if required:
            raise ApiError(400, "invalid_request", f"Parameter '{name}' not specified")
        return None
    if not isinstance(value, str):
        raise ApiError(400, "invalid_request", f"Parameter '{name}' must be a string")
    return value


def check_options(fields: dict[str, Any]) -> None:
    """The options DeepL validates, refused as DeepL refuses them (400 with its wording)."""
    for name, allowed in CHOICES.items():
        value = fields.get(name)
        if isinstance(value, bool) and name in _FLAGS:
            continue
        if value not in (None, "") and (not isinstance(value, str) or value not in allowed):
            raise ApiError(400, "invalid_request", f"Value for '{name}' not supported.")
    for name in TAG_LISTS:
        tag_list(fields, name)
    formality = string_field(fields, "formality")
    if formality is not None and formality not in FORMALITIES:
        raise ApiError(400, "invalid_request", "Value for 'formality' not supported.")
    if formality in ("more", "less"):
        # No served target has formality variants (``supports_formality`` is false for
        # every one): DeepL refuses these there, and falls back for the ``prefer_`` ones.
        raise ApiError(
            400,
            "formality_not_supported",
            "'formality' is not supported for given 'target_lang'.",
        )
    string_field(fields, "context")  # a string (not billed, no effect: the models have none)
    threshold = fields.get("translation_memory_threshold")
    if threshold is not None:
        try:
            in_range = 0 <= int(threshold) <= 100 and not isinstance(threshold, bool)
        except (TypeError, ValueError):
            in_range = False
        if not in_range:
            raise ApiError(
                400,
                "invalid_request",
                "Value for 'translation_memory_threshold' not supported: 0 to 100.",
            )


def flag(fields: dict[str, Any], name: str, default: bool) -> bool:
    value = fields.get(name)
    if value is None or value == "":
        return default
    return value if isinstance(value, bool) else value in ("1", "true")


def tag_list(fields: dict[str, Any], name: str) -> frozenset[str]:
    """A tag list: JSON's list of names or a comma-separated string (lower-case, as the
    markup parser reports tag names)."""
    value = fields.get(name)
    if value is None:
        return frozenset()
    parts = [value] if isinstance(value, str) else value
    if not isinstance(parts, list) or not all(isinstance(part, str) for part in parts):
        raise ApiError(400, "invalid_request", f"Parameter '{name}' must be a list of tags")
    return frozenset(
        tag.strip().lower() for part in parts for tag in part.split(",") if tag.strip()
    )


def text_handling(fields: dict[str, Any]) -> TextHandling:
    """``split_sentences`` and ``preserve_formatting`` (checked by :func:`check_options`)."""
    tagged = string_field(fields, "tag_handling") is not None
    default = SentenceSplit.PUNCTUATION if tagged else SentenceSplit.LINES_AND_PUNCTUATION
    split = string_field(fields, "split_sentences")
    return TextHandling(
        split=SentenceSplit(split) if split else default,
        preserve_formatting=flag(fields, "preserve_formatting", False),
    )


def markup_rules(fields: dict[str, Any]) -> MarkupRules:
    """The tag options (checked by :func:`check_options`)."""
    return MarkupRules(
        ignore=tag_list(fields, "ignore_tags"),
        splitting=tag_list(fields, "splitting_tags"),
        non_splitting=tag_list(fields, "non_splitting_tags"),
        outline_detection=flag(fields, "outline_detection", True),
    )
