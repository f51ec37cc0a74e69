"""The request and response shapes of Google's Cloud Translation API v2
(service/web/routes/google.py), as its documentation and its client libraries
(``google.cloud.translate_v2``) write and read them."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, StrictStr, field_validator


class GoogleTranslateRequest(BaseModel):
    """``POST/GET /language/translate/v2``: its fields from the query string, a JSON body or
    form fields. Google's client sends ``cid`` and nulls for what it leaves out; what this
    service has no use for is ignored, as Google ignores unknown parameters."""

    model_config = ConfigDict(extra="ignore")

    q: list[StrictStr] = Field(min_length=1, description="The texts (repeated, or a list).")
    target: StrictStr = Field(description="The language to translate into (ISO 639-1).")
    source: StrictStr | None = Field(None, description="The texts' language; omitted: detected.")
    format: Literal["text", "html"] | None = Field(
        None, description="`html` (Google's default) translates between the tags; `text` not."
    )
    model: StrictStr | None = Field(
        None, description="`base` or `nmt` in Google's API; echoed, the served models translate."
    )

    @field_validator("q", mode="before")
    @classmethod
    def _one_text_is_a_list(cls, value: object) -> object:
        return [value] if isinstance(value, str) else value


class GoogleDetectRequest(BaseModel):
    """``POST/GET /language/translate/v2/detect``."""

    model_config = ConfigDict(extra="ignore")

    q: list[StrictStr] = Field(min_length=1, description="The texts (repeated, or a list).")

    @field_validator("q", mode="before")
    @classmethod
    def _one_text_is_a_list(cls, value: object) -> object:
        return [value] if isinstance(value, str) else value


class GoogleTranslation(BaseModel):
    translatedText: str  # noqa: N815
    # Only when the source was detected, as Google answers.
    detectedSourceLanguage: str | None = None  # noqa: N815
    model: str | None = None  # only when the request named one


class GoogleTranslations(BaseModel):
    translations: list[GoogleTranslation]


class GoogleTranslateResponse(BaseModel):
    """``{"data": {"translations": [{"translatedText", "detectedSourceLanguage"?}]}}``"""

    data: GoogleTranslations


class GoogleDetection(BaseModel):
    language: str
    isReliable: bool  # noqa: N815
    confidence: float = Field(description="0 to 1: the detector's probability.")


class GoogleDetections(BaseModel):
    detections: list[list[GoogleDetection]]  # one list per text, the best detection in it


class GoogleDetectResponse(BaseModel):
    data: GoogleDetections


class GoogleLanguagesQuery(BaseModel):
    """``GET /language/translate/v2/languages``'s parameters."""

    target: StrictStr | None = Field(
        None, description="Name the languages (in English here: no localized names)."
    )
    model: StrictStr | None = Field(None, description="`base` or `nmt`: one list serves both.")


class GoogleLanguage(BaseModel):
    language: str
    name: str | None = None  # only when the request named a ``target`` (in English here)


class GoogleLanguages(BaseModel):
    languages: list[GoogleLanguage]


class GoogleLanguagesResponse(BaseModel):
    data: GoogleLanguages


class GoogleErrorDetail(BaseModel):
    message: str
    domain: str
    reason: str


class GoogleError(BaseModel):
    code: int
    message: str
    errors: list[GoogleErrorDetail]
    status: str


class GoogleErrorResponse(BaseModel):
    """Every error of Google's API, in its shape (service/web/errors.py ``error_body``)."""

    error: GoogleError


GOOGLE_ERROR_RESPONSES: dict[int | str, dict[str, object]] = {
    status: {"model": GoogleErrorResponse} for status in (400, 401, 403, 413, 429, 503, 504)
}
