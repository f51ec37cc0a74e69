"""LibreTranslate's file translation: ``POST /translate_file`` (multipart: ``file``, ``source``,
``target``, ``api_key``) → ``{"translatedFileUrl": …}``, and ``GET /download_file/<name>``.

Formats and what is kept: service/text/files.py. The file's texts go through the
translator in request-sized chunks (service/text/bulk.py), so a file is limited by
``MT_MAX_BODY_BYTES``, not by the texts-per-request limit. Refusals use LibreTranslate's
texts ("Invalid request: missing file parameter", "Invalid request: file format not
supported", …) in our error shape.
"""

from __future__ import annotations

from fastapi import APIRouter, Request, Response
from fastapi.responses import FileResponse
from starlette.datastructures import UploadFile

from service.text.bulk import translate_in_chunks
from service.text.files import SUPPORTED_EXTENSIONS, UnsupportedFile, supported
from service.text.files import translate_file as translate_file_content
from service.translation.dispatch import document_translator
from service.translation.languages import LanguagePair
from service.web.deps import Access, Service, run_for_client, upload_body
from service.web.errors import ApiError
from service.web.file_store import TranslatedFiles, attachment
from service.web.lifecycle import ServiceState
from service.web.routes.memories import memory_choice
from service.web.schemas import TranslateFileResponse

router = APIRouter()


def require_files_enabled(service: ServiceState) -> None:
    """Both file routes refuse alike when file translation is off (403: the server's
    configuration forbids it, not the request's form)."""
    if not service.settings.storage.files_translation:
        raise ApiError(403, "files_disabled", "Files translation are disabled on this server.")


def checked_upload(upload: object) -> tuple[UploadFile, str]:
    """The uploaded file and its name; a missing file, an empty name or a format no reader
    serves is refused with LibreTranslate's texts (both file APIs)."""
    if not isinstance(upload, UploadFile):
        raise ApiError(400, "invalid_request", "Invalid request: missing file parameter")
    if not upload.filename:
        raise ApiError(400, "invalid_request", "Invalid request: empty file")
    if not supported(upload.filename):
        raise ApiError(400, "invalid_request", "Invalid request: file format not supported")
    return upload, upload.filename


def file_store(request: Request) -> TranslatedFiles:
    return request.app.state.translated_files


@router.post(
    "/translate_file",
    response_model=TranslateFileResponse,
    summary=f"Translate a file ({', '.join(SUPPORTED_EXTENSIONS)}); LibreTranslate-compatible",
    openapi_extra=upload_body(
        ["source", "target"],
        {
            "source": {"type": "string", "example": "en"},
            "target": {"type": "string", "example": "de"},
            "api_key": {"type": "string"},
        },
    ),
)
async def translate_file(
    request: Request, service: Service, access: Access
) -> TranslateFileResponse:
    require_files_enabled(service)
    content_type = request.headers.get("content-type", "")
    if not content_type.startswith("multipart/form-data"):
        raise ApiError(400, "invalid_request", "Invalid request: missing file parameter")
    form = await request.form()
    api_key = form.get("api_key")
    body_key = api_key if isinstance(api_key, str) else None
    # Keys and the request rate now; a file's characters are known once it is parsed, and
    # are counted (MT_RATE_LIMIT_CHARS_PER_MINUTE) before any of its texts is translated.
    owner = access.admit(request, body_key, chars=0)
    upload = form.get("file")
    for name in ("source", "target"):
        if not form.get(name):
            raise ApiError(400, "invalid_request", f"Invalid request: missing {name} parameter")
    upload, filename = checked_upload(upload)
    languages = LanguagePair.parse(str(form["source"]), str(form["target"]))
    dispatcher = service.require_dispatcher()
    content = await upload.read()
    options = service.limits.options(None, None)
    # The pair is chosen once for the whole file: a named source is checked now, before any
    # work; "auto" is detected on the file's first texts.
    memory = memory_choice(owner)
    translate_chunk = document_translator(dispatcher, languages, options, memory)

    async def translate_texts(texts: list[str]) -> list[str]:
        # Every format hands over all of its texts in one call: the whole file is counted
        # before the first chunk goes to a model.
        access.charge_characters(request, body_key, chars=sum(map(len, texts)))
        return await translate_in_chunks(
            texts, service.limits.max_texts_per_request, translate_chunk
        )

    try:
        translated = await run_for_client(
            request,
            service,
            translate_file_content(filename, content, languages.target.code, translate_texts),
        )
    except UnsupportedFile as error:
        raise ApiError(400, "invalid_request", f"Invalid request: {error}") from error
    stored = file_store(request).save(translated.filename, translated.content)
    url = request.url_for("download_file", filename=stored)
    return TranslateFileResponse(translatedFileUrl=str(url))


@router.get(
    "/download_file/{filename}",
    summary="Download a translated file (the URL /translate_file returned)",
    response_class=FileResponse,
)
async def download_file(filename: str, request: Request, service: Service) -> Response:
    require_files_enabled(service)
    store = file_store(request)
    content = store.content(filename)
    if content is None:
        raise ApiError(404, "file_not_found", "Invalid filename")
    return attachment(content, store.download_name(filename))
