"""Pydantic models of the request and response bodies of the translation APIs (the stored
items' bodies, glossaries, memories and document jobs, are in service/web/stored_schemas.py).

Static checks (types, ``beam_size >= 1``) live here; limits that come from the settings
(``MT_MAX_BEAM_SIZE``, ``MT_MAX_TEXTS_PER_REQUEST`` …) are checked by the translator, so
the error message can name the environment variable.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, StrictStr, field_validator


def valid_unicode(value: str | list[str] | None) -> str | list[str] | None:
    """JSON may carry ``\\ud800``, an unpaired UTF-16 surrogate: a Python str can hold it,
    but it is no character, cannot be encoded to UTF-8 (the tokenizer, the response) and is
    always the client's mistake, so it is refused at validation rather than failing deep
    inside (a field validator, so error locations stay ``text``, ``q`` ...)."""
    for index, text in enumerate([value] if isinstance(value, str) else value or []):
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as error:
            where = "" if isinstance(value, str) else f"text {index}: "
            raise ValueError(
                f"{where}unpaired UTF-16 surrogate U+{ord(text[error.start]):04X} at index "
                f"{error.start}; send valid Unicode"
            ) from None
    return value


class TranslateRequest(BaseModel):
    """``POST /v1/translate``."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={"examples": [{"text": "Save changes"}, {"text": ["Open", "Close"]}]},
    )

    # Strict strings: a number or null in the list is the client's mistake, not something
    # to translate as "123".
    text: StrictStr | list[StrictStr] = Field(description="One text or a list of texts.")
    source_lang: str | None = Field(
        None, description="Source language code; omitted or 'auto': detected."
    )
    target_lang: str | None = Field(
        None,
        description="Target language code; may be omitted when the source has one target.",
    )
    beam_size: int | None = Field(None, ge=1, description="1 = greedy; at most MT_MAX_BEAM_SIZE.")
    max_new_tokens: int | None = Field(
        None, ge=1, description="Most tokens generated per sentence; at most MT_MAX_NEW_TOKENS."
    )

    glossary: dict[StrictStr, StrictStr] | None = Field(
        None,
        description="Terms enforced exactly: {source term: target term}; matched "
        "case-insensitively at word boundaries, longest first, and written as the exact "
        "target term. At most MT_MAX_GLOSSARY_ENTRIES entries.",
    )
    glossary_id: str | None = Field(
        None, description="A stored glossary (POST /v1/glossaries) for this language pair."
    )
    memory_id: str | None = Field(
        None,
        description="A translation memory (POST /v1/memories) for this language pair; "
        "omitted: the pair's default memory, if it has one.",
    )
    use_memory: bool = Field(
        True, description="false: no translation memory, not even the pair's default."
    )

    _valid_unicode = field_validator("text", "source_lang", "target_lang", "memory_id")(
        valid_unicode
    )

    @field_validator("glossary")
    @classmethod
    def _valid_glossary(cls, value: dict[str, str] | None) -> dict[str, str] | None:
        for source, target in (value or {}).items():
            valid_unicode([source, target])
        return value


class DetectedLanguage(BaseModel):
    language: str
    confidence: float = Field(
        description="0 to 100: the detector's probability for this language among the served "
        "source languages. Short texts can be close calls (below about 90): send source_lang "
        "to be sure. /v1/translate also answers it in the X-Detected-Language-Confidence header."
    )


class Translation(BaseModel):
    text: str = Field(description="The translation; whitespace around sentences kept.")
    tokens: int = Field(description="Tokens generated for this text (all its sentences).")
    sentences: int = Field(description="Sentences the text was split into (rows decoded).")
    source_lang: str | None = Field(
        None,
        description="This text's source language (with a detected source, each text of a "
        "list is detected and routed on its own).",
    )
    models: list[str] | None = Field(
        None,
        description="The models that translated this text, in order (both of a pivot; none "
        "when the text comes back unchanged).",
    )
    detected_language: DetectedLanguage | None = Field(
        None, description="This text's detected language, set when the source was detected."
    )
    unchanged: bool = Field(
        False,
        description="True when this text's source language is its target: it comes back as "
        "sent and no model ran.",
    )


class Usage(BaseModel):
    input_tokens: int = Field(description="Source tokens sent to the model, eos included.")
    output_tokens: int = Field(description="Tokens generated.")
    sentences: int = Field(description="Rows decoded (cache hits and empty texts excluded).")
    cached_sentences: int = Field(0, description="Sentences answered from the translation cache.")
    memory_sentences: int = Field(
        0,
        description="Segments (whole texts or sentences) written from a translation memory, "
        "without the model.",
    )


class TranslateResponse(BaseModel):
    translations: list[Translation] = Field(description="One per input text, in input order.")
    model: str = Field(description="The models that ran, joined by '+' (a pivot runs two).")
    models: list[str] = Field(
        description="The models that ran, in order: one (direct), two (pivot through "
        "MT_PIVOT_LANG) or none (source and target are the same language). A detected list "
        "whose texts went different routes: every model that ran, in order of first use "
        "(each translation names its own)."
    )
    source_lang: str = Field(
        description="The source language (detected for 'auto'; of the first text when the "
        "texts of a list were detected one by one: each translation has its own)."
    )
    target_lang: str
    detected_language: DetectedLanguage | None = Field(
        None,
        description="Set when the source language was detected (for a list, the first "
        "text's; each translation has its own).",
    )
    usage: Usage
    time_ms: float = Field(description="Time spent in the service for this request.")


class LibreTranslateRequest(BaseModel):
    """``POST /translate``: the LibreTranslate request (JSON or form fields)."""

    model_config = ConfigDict(extra="ignore")

    q: StrictStr | list[StrictStr] = Field(description="Text or list of texts.")
    source: str = Field("auto", description="Source language code or 'auto' (detected).")
    target: str | None = Field(
        None, description="Target language code (may be omitted when the source has one)."
    )
    format: Literal["text", "html"] = Field(
        "text",
        description="`html`: translate the text between the tags; markup, entities, "
        'script/style/code/pre and translate="no" elements are kept.',
    )
    alternatives: int | StrictStr = Field(
        0,
        description="How many other translations to return (from the beam's n-best), at most "
        "MT_ALTERNATIVES_LIMIT; text format only (html gets []), as LibreTranslate.",
    )
    api_key: str | None = Field(
        None,
        description="API key, when the service has keys (MT_API_KEYS); else ignored. "
        "`Authorization: Bearer KEY` works too.",
    )

    _valid_unicode = field_validator("q", "source", "target", "api_key")(valid_unicode)


class DetectRequest(BaseModel):
    """``POST /detect``: LibreTranslate's detection request (JSON or form fields)."""

    model_config = ConfigDict(extra="ignore")

    q: StrictStr | list[StrictStr] = Field(description="Text (or texts) to detect.")
    api_key: str | None = Field(None, description="Accepted and ignored.")

    _valid_unicode = field_validator("q", "api_key")(valid_unicode)


class LibreTranslateResponse(BaseModel):
    # LibreTranslate's field names.
    translatedText: str | list[str]  # noqa: N815
    detectedLanguage: DetectedLanguage | list[DetectedLanguage] | None = None  # noqa: N815
    alternatives: list[str] | list[list[str]] | None = None


class Language(BaseModel):
    """One entry of ``GET /languages`` (LibreTranslate's shape)."""

    code: str
    name: str
    targets: list[str]


class ModelCard(BaseModel):
    id: str
    source_lang: str
    target_lang: str
    languages: list[str] = Field(
        default_factory=list,
        description="A multilingual model's languages: it translates between any two of "
        "them (source_lang and target_lang are then its first two). Empty: one pair.",
    )
    provider: str = Field(
        description="ONNX Runtime execution provider in use (the setting until loaded)."
    )
    state: Literal["unloaded", "loading", "loaded", "failed"]
    ready: bool = Field(description="state == 'loaded'.")
    weights_bytes: int = Field(description="Size of the export's ONNX files.")
    memory_bytes: int | None = Field(
        None,
        description="Growth of the process's resident memory while the model loaded and "
        "warmed up (None when not loaded).",
    )
    revision: str | None = Field(
        None,
        description="The Hugging Face Hub revision of a model installed by `python -m service "
        "models pull` that this process serves (None for exports made by hand, or until "
        "loaded).",
    )


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class Status(BaseModel):
    status: str
    detail: str | None = None


class ErrorResponse(BaseModel):
    """Every error: ``error`` is what LibreTranslate clients read; ``code`` is for programs."""

    error: str
    code: str


class TranslateFileResponse(BaseModel):
    """``POST /translate_file`` (LibreTranslate's shape)."""

    translatedFileUrl: str  # noqa: N815


class FrontendLanguage(BaseModel):
    code: str
    name: str


class FrontendLanguages(BaseModel):
    source: FrontendLanguage
    target: FrontendLanguage


class FrontendSettings(BaseModel):
    """``GET /frontend/settings``: LibreTranslate's fields, then ours (camelCase like theirs)."""

    charLimit: int = Field(description="Characters per text (MT_MAX_CHARS_PER_TEXT).")  # noqa: N815
    frontendTimeout: int = Field(description="Debounce of translate-as-you-type, ms.")  # noqa: N815
    apiKeys: bool = Field(  # noqa: N815
        False, description="API keys are on (MT_API_KEYS or MT_API_KEYS_FILE)."
    )
    keyRequired: bool = Field(  # noqa: N815
        False, description="Every translation needs a key (true whenever keys are on)."
    )
    suggestions: bool = False
    filesTranslation: bool  # noqa: N815
    supportedFilesFormat: list[str]  # noqa: N815
    language: FrontendLanguages
    maxBeamSize: int  # noqa: N815
    defaultBeamSize: int  # noqa: N815
    alternativesLimit: int  # noqa: N815
    maxTextsPerRequest: int  # noqa: N815
    maxBodyBytes: int  # noqa: N815
