"""Document jobs: ``POST /v1/documents`` (multipart: ``file``, ``target_lang``, optional
``source_lang``) → 202 with the job's id; ``GET /v1/documents/{id}`` for its status and
progress; ``GET /v1/documents/{id}/result`` for the translated document;
``DELETE /v1/documents/{id}`` cancels it. DeepL's ``/v2/document`` (service/web/routes/deepl.py)
is the same jobs.

The upload is read once on arrival (in a worker thread): a file that is corrupt, encrypted,
a zip bomb or declares XML entities is refused with 400 there and then, its sentences are
counted for the progress, and its characters are charged to the client before it is queued.
The translation itself runs in the background (service/translation/document_jobs.py).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace

from fastapi import APIRouter, Request, Response
from fastapi.responses import FileResponse

from service.errors import NotFound
from service.storage.documents import DocumentJob
from service.storage.owners import Owner
from service.text.documents.inline import TAG_RE
from service.text.files import UnsupportedFile, translate_file
from service.translation.document_jobs import count_sentences
from service.translation.languages import LanguageCode, LanguagePair
from service.translation.routing import targets_by_source
from service.web.access import AccessPolicy
from service.web.deps import Access, CurrentOwner, Service, upload_body
from service.web.errors import ERROR_RESPONSES, ApiError
from service.web.file_store import attachment, safe_filename
from service.web.lifecycle import ServiceState
from service.web.routes.files import checked_upload, require_files_enabled
from service.web.schemas import DocumentJobStatus

router = APIRouter(prefix="/v1/documents")


async def read_texts(filename: str, content: bytes, target: str) -> list[str]:
    """The texts the document would send to the translator; a bad file is refused (400)."""
    texts: list[str] = []

    async def collect(batch: list[str]) -> list[str]:
        texts.extend(batch)
        return list(batch)

    def scan() -> None:
        asyncio.run(translate_file(filename, content, target, collect))

    try:
        await asyncio.to_thread(scan)
    except UnsupportedFile as error:
        raise ApiError(400, "invalid_request", f"Invalid request: {error}") from error
    return texts


async def submit(
    request: Request,
    service: ServiceState,
    access: AccessPolicy,
    owner: Owner,
    upload: object,
    source: str | None,
    target: str | None,
) -> DocumentJob:
    """Check, count, charge and queue ``owner``'s uploaded document (both APIs)."""
    require_files_enabled(service)
    upload, filename = checked_upload(upload)
    dispatcher = service.require_dispatcher()
    languages = LanguagePair.parse(source, target)
    if not target:
        if languages.detects:
            raise ApiError(400, "invalid_request", "Invalid request: missing target_lang parameter")
        default = dispatcher.default_target(languages.source.code)
        languages = replace(languages, target=LanguageCode(default))
    if not languages.detects:
        dispatcher.route(languages)  # an unserved pair is refused now
    elif service.registry is not None:
        # Detected later, but a target no served language translates into fails whatever
        # is detected: refused now, as /translate_file refuses it.
        reachable = targets_by_source(service.registry.by_pair, service.settings.model.pivot_lang)
        if languages.target.code not in {t for ts in reachable.values() for t in ts}:
            raise ApiError(
                400,
                "unsupported_language",
                f"Invalid request: target language {languages.target.code} is not supported",
            )
    source, target = languages.source.code, languages.target.code
    content = await upload.read()
    texts = await read_texts(filename, content, target)
    # A text the translator would refuse (over MT_MAX_CHARS_PER_TEXT: a long .po msgid, a
    # paragraph of many runs) fails the job whatever happens: 413 now, not an error later.
    for text in texts:
        service.limits.check_request_size([text])
    # Characters of the text itself: formatting boundaries are the service's markup.
    characters = sum(len(TAG_RE.sub("", text)) for text in texts)
    access.charge_characters(request, None, chars=characters)
    job = await asyncio.to_thread(
        service.documents.create,
        safe_filename(filename),
        content,
        source,
        target,
        count_sentences(texts, source if source != "auto" else "en"),
        characters,
        owner.key,
    )
    service.document_runner.submit(job)
    return job


def owned_job(service: ServiceState, job_id: str, owner: Owner) -> DocumentJob:
    """The job, 404 for an unknown id and for another key's job alike (a job is its
    uploader's; keys off or an admin key see every one)."""
    job = service.documents.get(job_id)
    if owner.key is not None and job.owner_key != owner.key:
        raise NotFound(f"no document job with id {job_id!r}", "document_not_found")
    return job


def job_status(request: Request, job: DocumentJob) -> DocumentJobStatus:
    total = job.sentences_total
    return DocumentJobStatus(
        id=job.job_id,
        status=job.status,  # the store writes only these
        filename=job.filename,
        source_lang=job.source_lang,
        target_lang=job.target_lang,
        sentences_done=job.sentences_done,
        sentences_total=total,
        progress=1.0 if job.status == "done" else (job.sentences_done / total if total else 0.0),
        seconds_left=job.seconds_left(time.time()),
        error=job.error,
        result_url=str(request.url_for("document_result", job_id=job.job_id))
        if job.status == "done"
        else None,
    )


def result_response(service: ServiceState, job: DocumentJob) -> Response:
    """The finished document; 409 while it is not (yet) there, 410 once it was deleted."""
    content = service.documents.result(job)
    if content is None and job.status in ("done", "deleted"):
        raise ApiError(410, "document_deleted", "the translated document was deleted")
    if content is None:
        detail = f": {job.error}" if job.error else ""
        raise ApiError(
            409,
            "document_not_ready",
            f"the document is not translated (status {job.status}){detail}",
        )
    return attachment(content, job.result_name or job.filename)


_UPLOAD_BODY = upload_body(
    ["target_lang"],
    {
        "source_lang": {"type": "string", "example": "en"},
        "target_lang": {"type": "string", "example": "de"},
    },
)


@router.post(
    "",
    status_code=202,
    response_model=DocumentJobStatus,
    responses=ERROR_RESPONSES,
    summary="Upload a document to translate in the background",
    openapi_extra=_UPLOAD_BODY,
)
async def create_job(
    request: Request, service: Service, access: Access, owner: CurrentOwner
) -> DocumentJobStatus:
    # Admitted as one request of no characters: they are charged once the file is read.
    if not request.headers.get("content-type", "").startswith("multipart/form-data"):
        raise ApiError(400, "invalid_request", "Invalid request: missing file parameter")
    form = await request.form()
    source, target = form.get("source_lang"), form.get("target_lang")
    job = await submit(
        request,
        service,
        access,
        owner,
        form.get("file"),
        source if isinstance(source, str) else None,
        target if isinstance(target, str) else None,
    )
    return job_status(request, job)


@router.get(
    "/{job_id}",
    response_model=DocumentJobStatus,
    responses=ERROR_RESPONSES,
    summary="A document job's status and progress",
)
async def get_job(
    job_id: str, request: Request, service: Service, owner: CurrentOwner
) -> DocumentJobStatus:
    return job_status(request, owned_job(service, job_id, owner))


@router.get(
    "/{job_id}/result",
    name="document_result",
    response_class=FileResponse,
    responses={**ERROR_RESPONSES, 409: ERROR_RESPONSES[400], 410: ERROR_RESPONSES[400]},
    summary="The translated document (409 until the job is done)",
)
async def get_result(job_id: str, service: Service, owner: CurrentOwner) -> Response:
    return result_response(service, owned_job(service, job_id, owner))


@router.delete(
    "/{job_id}",
    response_model=DocumentJobStatus,
    responses=ERROR_RESPONSES,
    summary="Cancel a document job (and delete its files)",
)
async def cancel_job(
    job_id: str, request: Request, service: Service, owner: CurrentOwner
) -> DocumentJobStatus:
    owned_job(service, job_id, owner)  # 404 before anything is cancelled
    return job_status(request, service.document_runner.cancel(job_id))
