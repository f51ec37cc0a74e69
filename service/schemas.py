"""Pydantic models of every request and response body of the HTTP API.

Static checks (types, ``beam_size >= 1``) live here; limits that come from the settings
(``MT_MAX_BEAM_SIZE``, ``MT_MAX_TEXTS_PER_REQUEST`` …) are checked by the translator, so
the error message can name the environment variable.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, StrictStr


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
        None, description="Must be the model's source language or 'auto'."
    )
    target_lang: str | None = Field(None, description="Must be the model's target language.")
    beam_size: int | None = Field(None, ge=1, description="1 = greedy; at most MT_MAX_BEAM_SIZE.")
    max_new_tokens: int | None = Field(
        None, ge=1, description="Most tokens generated per sentence; at most MT_MAX_NEW_TOKENS."
    )


class Translation(BaseModel):
    text: str = Field(description="The translation; whitespace around sentences kept.")
    tokens: int = Field(description="Tokens generated for this text (all its sentences).")
    sentences: int = Field(description="Sentences the text was split into (rows decoded).")


class Usage(BaseModel):
    input_tokens: int = Field(description="Source tokens sent to the model, eos included.")
    output_tokens: int = Field(description="Tokens generated.")
    sentences: int = Field(description="Rows decoded (cache hits and empty texts excluded).")
    cached_sentences: int = Field(0, description="Sentences answered from the translation cache.")


class TranslateResponse(BaseModel):
    translations: list[Translation] = Field(description="One per input text, in input order.")
    model: str
    source_lang: str
    target_lang: str
    usage: Usage
    time_ms: float = Field(description="Time spent in the service for this request.")


class LibreTranslateRequest(BaseModel):
    """``POST /translate``: the LibreTranslate request (JSON or form fields)."""

    model_config = ConfigDict(extra="ignore")

    q: StrictStr | list[StrictStr] = Field(description="Text or list of texts.")
    source: str = Field("auto", description="Source language code or 'auto'.")
    target: str | None = Field(None, description="Target language code (the model's if omitted).")
    format: Literal["text", "html"] = "text"
    api_key: str | None = Field(None, description="Accepted and ignored.")


class DetectedLanguage(BaseModel):
    language: str
    confidence: float


class LibreTranslateResponse(BaseModel):
    # LibreTranslate's field names.
    translatedText: str | list[str]  # noqa: N815
    detectedLanguage: DetectedLanguage | list[DetectedLanguage] | None = None  # noqa: N815


class Language(BaseModel):
    """One entry of ``GET /languages`` (LibreTranslate's shape)."""

    code: str
    name: str
    targets: list[str]


class ModelCard(BaseModel):
    id: str
    source_lang: str
    target_lang: str
    provider: str = Field(description="ONNX Runtime execution provider in use.")
    ready: bool


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
