"""The web page at ``/`` (static HTML, CSS and JavaScript from service/web/static/, no CDN and no
build step) and LibreTranslate's ``GET /frontend/settings``, which the page reads for its
limits and for whether it must ask for an API key."""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter
from fastapi.responses import FileResponse

from service.text.files import SUPPORTED_EXTENSIONS
from service.translation.languages import language_name
from service.web.deps import Access, Service
from service.web.schemas import FrontendLanguage, FrontendLanguages, FrontendSettings

STATIC_DIR = Path(__file__).resolve().parent.parent / "static"
router = APIRouter()


@router.get("/", include_in_schema=False, response_class=FileResponse)
async def index() -> FileResponse:
    return FileResponse(STATIC_DIR / "index.html", media_type="text/html")


@router.get(
    "/frontend/settings",
    response_model=FrontendSettings,
    summary="Limits and defaults for a front end (LibreTranslate's fields, then ours)",
)
async def frontend_settings(service: Service, access: Access) -> FrontendSettings:
    settings = service.settings
    pairs = sorted(service.registry.by_pair) if service.registry is not None else []
    source, target = pairs[0] if pairs else ("auto", "")
    return FrontendSettings(
        charLimit=settings.limits.max_chars_per_text,
        frontendTimeout=settings.process.frontend_timeout_ms,
        # With keys configured every translation needs one (the page then asks for it).
        apiKeys=access.keys_required,
        keyRequired=access.keys_required,
        filesTranslation=settings.storage.files_translation,
        supportedFilesFormat=list(SUPPORTED_EXTENSIONS)
        if settings.storage.files_translation
        else [],
        language=FrontendLanguages(
            # LibreTranslate's default front-end source is "auto" when it can detect.
            source=FrontendLanguage(code="auto", name="Auto Detect")
            if settings.model.language_detection and len({s for s, _ in pairs}) > 1
            else FrontendLanguage(code=source, name=language_name(source)),
            target=FrontendLanguage(code=target, name=language_name(target)),
        ),
        maxBeamSize=settings.limits.max_beam_size,
        defaultBeamSize=settings.limits.default_beam_size,
        alternativesLimit=min(
            settings.access.alternatives_limit, settings.limits.max_beam_size - 1
        ),
        maxTextsPerRequest=settings.limits.max_texts_per_request,
        maxBodyBytes=settings.access.max_body_bytes,
    )
