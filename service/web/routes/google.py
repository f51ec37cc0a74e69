"""Google's Cloud Translation API v2 (Basic), so code written for it (the official
``google-cloud-translate`` client's ``translate_v2`` with ``client_options={"api_endpoint":
...}``, and the many tools that speak it) works against this service unchanged:

* ``POST /language/translate/v2`` (or GET): ``q`` (repeated, or a JSON list), ``target``,
  ``source`` (omitted: each text's language is detected and answered as
  ``detectedSourceLanguage``), ``format`` (``html``, Google's default, or ``text``) and
  ``model`` (echoed; the served models translate).
* ``POST /language/translate/v2/detect`` (or GET): one detection per text, confidence 0 to 1.
* ``GET /language/translate/v2/languages`` (or POST): the served languages; with ``target``,
  their names (in English: the service has no localized names).

Fields come from the query string, a JSON body or form fields, as Google takes them. Keys: the
``key`` query parameter, ``X-Goog-Api-Key`` or ``Authorization: Bearer``, one of the service's
API keys, under the same rate limits and translation memories as every API (Google's v2 has
no glossaries). Errors come in Google's shape (service/web/errors.py ``error_body``), with the
service's statuses, but for a missing key: 403 as Google answers (its clients would take a
401 for credentials to refresh).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from fastapi import APIRouter, Request, Response
from pydantic import BaseModel

from service.storage.owners import Owner
from service.translation.dispatch import collect
from service.translation.languages import LanguagePair, language_name
from service.translation.request import Routing, TranslationRequest
from service.translation.routing import targets_by_source
from service.web.access import AccessPolicy
from service.web.deps import (
    FORM_TYPES,
    Access,
    Service,
    json_body,
    request_body,
    run_for_client,
    sends_form,
)
from service.web.errors import ApiError, validated
from service.web.google_schemas import (
    GOOGLE_ERROR_RESPONSES,
    GoogleDetection,
    GoogleDetections,
    GoogleDetectRequest,
    GoogleDetectResponse,
    GoogleLanguage,
    GoogleLanguages,
    GoogleLanguagesQuery,
    GoogleLanguagesResponse,
    GoogleTranslateRequest,
    GoogleTranslateResponse,
    GoogleTranslation,
    GoogleTranslations,
)
from service.web.routes.memories import memory_choice
from service.web.routes.v1 import MODELS_HEADER

router = APIRouter(prefix="/language/translate/v2")
Body = TypeVar("Body", bound=BaseModel)
_TRANSLATE_BODY = request_body(
    GoogleTranslateRequest.model_json_schema(), "application/json", *FORM_TYPES
)
_DETECT_BODY = request_body(
    GoogleDetectRequest.model_json_schema(), "application/json", *FORM_TYPES
)


def _query(model: type[BaseModel], required: tuple[str, ...]) -> dict[str, Any]:
    """The OpenAPI query parameters of a GET form: ``model``'s fields, ``q`` repeated."""
    parameters = []
    for name, field in model.model_fields.items():
        schema: dict[str, Any] = {"type": "string"}
        if name == "q":
            schema = {"type": "array", "items": {"type": "string"}}
        elif name == "format":
            schema = {"type": "string", "enum": ["text", "html"]}
        parameters.append(
            {
                "name": name,
                "in": "query",
                "required": name in required,
                "schema": schema,
                "description": field.description or "",
            }
        )
    key = {"name": "key", "in": "query", "required": False, "schema": {"type": "string"}}
    return {"parameters": [*parameters, key]}


Operation = tuple[str, str, dict[str, Any]]  # operation id, summary, OpenAPI extra
Endpoint = TypeVar("Endpoint", bound=Callable[..., Any])


def google_route(
    path: str, response_model: type[BaseModel], *, exclude_none: bool = True, **methods: Operation
) -> Callable[[Endpoint], Endpoint]:
    """Registers an endpoint once per HTTP method (v2 takes every call by GET and POST alike),
    each with its own operation id, summary and OpenAPI extra, and Google's error shapes."""

    def register(endpoint: Endpoint) -> Endpoint:
        for method, (operation_id, summary, extra) in methods.items():
            router.add_api_route(
                path,
                endpoint,
                methods=[method.upper()],
                operation_id=operation_id,
                response_model=response_model,
                response_model_exclude_none=exclude_none,
                responses={**GOOGLE_ERROR_RESPONSES},
                summary=f"{summary} (Google Cloud Translation API v2)",
                openapi_extra=extra,
            )
        return endpoint

    return register


def google_code(code: str | None) -> str | None:
    """``zh-CN`` → ``zh``: the service's code for one of Google's (a region is served by the
    language's model)."""
    return code.strip().split("-")[0].lower() or None if code else None


def api_key(request: Request) -> str | None:
    """Google's key: the ``key`` query parameter or the ``X-Goog-Api-Key`` header (a Bearer
    key is read by the access policy itself)."""
    return request.query_params.get("key") or request.headers.get("x-goog-api-key") or None


def admit(request: Request, access: AccessPolicy, chars: int) -> Owner:
    """The service's keys and limits; whose stored items the request sees. A missing key is Google's 403,
    not 401: Google's clients take a 401 for expired credentials and refresh them (which
    anonymous or API-key clients cannot) instead of reporting it."""
    try:
        return access.admit(request, api_key(request), chars=chars)
    except ApiError as error:
        if error.status == 401:
            raise ApiError(
                403, "api_key_required", f"The request is missing a valid API key. {error.message}"
            ) from error
        raise


async def read_fields(request: Request, model: type[Body]) -> Body:
    """The query string's fields, under those of the body (JSON or form), as ``model``; a
    repeated ``q`` is a list of texts."""
    data: dict[str, Any] = {key: request.query_params.get(key) for key in request.query_params}
    if questions := request.query_params.getlist("q"):
        data["q"] = questions
    if request.method == "POST":
        body: Any
        if sends_form(request):
            form = await request.form()
            body = {key: form.get(key) for key in form}
            if form_texts := form.getlist("q"):
                body["q"] = form_texts
        else:
            body = await json_body(request)
        if not isinstance(body, dict):
            raise ApiError(
                400, "invalid_request", "Invalid request: the body must be a JSON object"
            )
        data |= {key: value for key, value in body.items() if value is not None}
    data.pop("key", None)
    if not data.get("q"):
        raise ApiError(400, "invalid_request", "Required parameter: q")
    return validated(model, data, "Invalid request")


@google_route(
    "",
    GoogleTranslateResponse,
    get=(
        "google_translate_get",
        "Translate texts, fields in the query",
        _query(GoogleTranslateRequest, required=("q", "target")),
    ),
    post=("google_translate", "Translate texts", _TRANSLATE_BODY),
)
async def translate(
    request: Request, response: Response, service: Service, access: Access
) -> GoogleTranslateResponse:
    body = await read_fields(request, GoogleTranslateRequest)
    owner = admit(request, access, chars=sum(map(len, body.q)))
    dispatcher = service.require_dispatcher()
    text_format = body.format or "html"  # Google's default
    translation = TranslationRequest(
        body.q,
        LanguagePair.parse(google_code(body.source), google_code(body.target)),
        service.limits.options(None, None),
        format=text_format,
        memory=memory_choice(owner),
        # Each text's language on its own, as Google detects; HTML goes by one route.
        routing=Routing.EACH_TEXT if text_format == "text" else Routing.ONE_DETECTION,
    )
    result = await run_for_client(request, service, collect(dispatcher.translate(translation)))
    response.headers[MODELS_HEADER] = ",".join(result.plan.models)
    translations = []
    for index, text in enumerate(result.batch.translations):
        detected = result.plan.detection_of(index)
        translations.append(
            GoogleTranslation(
                translatedText=text.text,
                detectedSourceLanguage=detected.language if detected is not None else None,
                model=body.model,
            )
        )
    return GoogleTranslateResponse(data=GoogleTranslations(translations=translations))


@google_route(
    "/detect",
    GoogleDetectResponse,
    exclude_none=False,
    get=(
        "google_detect_get",
        "Detect the language of texts, in the query",
        _query(GoogleDetectRequest, required=("q",)),
    ),
    post=("google_detect", "Detect the language of texts", _DETECT_BODY),
)
async def detect(request: Request, service: Service, access: Access) -> GoogleDetectResponse:
    body = await read_fields(request, GoogleDetectRequest)
    admit(request, access, chars=sum(map(len, body.q)))
    dispatcher = service.require_dispatcher()
    detections = []
    for text in body.q:  # one detection per text, as Google answers
        best = (await dispatcher.detect(text))[0]
        # isReliable: deprecated by Google, which always answers false.
        one = GoogleDetection(
            language=best.language, isReliable=False, confidence=best.confidence / 100
        )
        detections.append([one])
    return GoogleDetectResponse(data=GoogleDetections(detections=detections))


@google_route(
    "/languages",
    GoogleLanguagesResponse,
    post=(
        "google_languages_post",
        "The served languages, by POST",
        _query(GoogleLanguagesQuery, required=()),
    ),
    get=("google_languages", "The served languages", _query(GoogleLanguagesQuery, required=())),
)
async def languages(request: Request, service: Service, access: Access) -> GoogleLanguagesResponse:
    admit(request, access, chars=0)
    named = bool(request.query_params.get("target"))
    if not named and request.method == "POST" and sends_form(request):
        named = bool((await request.form()).get("target"))
    elif not named and request.method == "POST":
        body = await json_body(request)
        named = isinstance(body, dict) and bool(body.get("target"))
    pairs = service.registry.by_pair if service.registry is not None else {}
    codes = sorted(targets_by_source(pairs, service.settings.model.pivot_lang))
    return GoogleLanguagesResponse(
        data=GoogleLanguages(
            languages=[
                GoogleLanguage(language=code, name=language_name(code) if named else None)
                for code in codes
            ]
        )
    )
