"""Service configuration: one ``Settings`` object of six groups, read from environment
variables prefixed with ``MT_``.

Each group is the object its consumer takes as it is: ``ModelSettings`` the model registry and
each engine (service/translation/model_settings.py), ``BatchingSettings`` the batcher
(service/scheduling/settings.py), ``TextLimits`` the text pipeline and the translator
(service/text/limits.py), ``StorageSettings`` the store (service/storage/settings.py); the
access and process groups below are read by the web layer and ``python -m service``. The variables stay flat (``MT_MAX_BATCH_ROWS``, not
``MT_SCHEDULING__MAX_BATCH_ROWS``): a field's variable is ``MT_`` and its name in capitals,
whatever its group, and ``Settings(max_batch_rows=7)`` sets the same field as that variable.

docs/configuration.md is generated from these models (``python scripts/config_docs.py``
rewrites it, and a test fails when it is stale).
"""

from __future__ import annotations

import ipaddress
import logging
import os
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic.fields import FieldInfo
from pydantic_settings import (
    BaseSettings,
    EnvSettingsSource,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)

from service.scheduling.settings import BatchingSettings
from service.storage.settings import StorageSettings
from service.text.limits import TextLimits
from service.translation.model_settings import ModelSettings

logger = logging.getLogger(__name__)

ENV_PREFIX = "MT_"

# Variables that were settings and are now fixed bounds, named constants beside the code that
# uses them: a value set for them is ignored, with a warning at start-up.
FIXED_NOW = {
    "ADMISSION_COST_TOLERANCE": "service/scheduling/chooser.py COST_TOLERANCE",
    "ADMISSION_MAX_STALL_STEPS": "service/scheduling/chooser.py MAX_STALL_STEPS",
    "ENCODER_IDLE_PRIORITY": "service/scheduling/overlap.py ENCODER_IDLE_PRIORITY",
    "ENCODER_MAX_LAG_MS": "service/scheduling/overlap.py ENCODER_MAX_LAG_S",
    # A hang-up is heard when it happens; only a route with its body unread still polls.
    "DISCONNECT_POLL_S": "service/web/deps.py UNREAD_BODY_POLL_S",
}


# Variables renamed so that each concept has one name: old name -> new name. The old ones
# still work (RenamedEnvSource), with a warning; a new name set beside its old one wins.
RENAMED = {
    "MODEL_DIR": "EXPORTS",  # one export: a list of one
    "MODEL_DIRS": "EXPORTS",
    "MODEL_NAME": "SERVED_MODEL_NAME",
}


class AccessSettings(BaseModel):
    """Access control and what the HTTP edge lets in (keys and rate limits are off by
    default)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    api_keys: str = Field(
        "",
        description="Comma-separated API keys. Any key (here or in api_keys_file) turns keys "
        "on: translation requests then need `Authorization: Bearer KEY` (or LibreTranslate's "
        "`api_key` field); a missing key is 401, an unknown one 403.",
    )
    api_keys_file: Path | None = Field(
        None,
        description='JSON file of API keys with their own limits: {"KEY": '
        '{"requests_per_minute": 60, "chars_per_minute": 50000}, ...}; missing limits are the '
        "global ones below.",
    )
    admin_api_keys: str = Field(
        "",
        description="Comma-separated API keys of the operator (keys too, as if listed in "
        "api_keys). With keys on, what a key stores (glossaries, memories, document jobs) is "
        "its own, 404 to other keys; what an admin key stores is shared: every key reads and "
        "uses it, only admin keys change or delete it.",
    )
    rate_limit_requests_per_minute: int = Field(
        0,
        ge=0,
        description="Translation requests per minute per API key (or per client address "
        "without keys), moving window; beyond it 429 with Retry-After. 0: no limit.",
    )
    rate_limit_chars_per_minute: int = Field(
        0,
        ge=0,
        description="Characters to translate per minute per API key or client address, "
        "moving window; 0: no limit.",
    )
    deepl_character_limit: int = Field(
        0,
        ge=0,
        description="Characters each API key (each client address when keys are off) may "
        "translate through DeepL's /v2/translate per calendar month (UTC); DeepL's 456 "
        "above it, and /v2/usage reports it. 0: no limit.",
    )
    trusted_proxies: str = Field(
        "",
        description="Comma-separated addresses and CIDRs of the proxies in front of the "
        "service (a load balancer, an ingress controller: `10.0.0.0/8,::1`). Only a request "
        "from one of them has its `Forwarded` or `X-Forwarded-For` (and `X-Forwarded-Proto`) "
        "read: the right-most address that is not a trusted proxy is the client, for rate "
        "limits, DeepL's monthly counts and logs. Empty: the peer is the client and those "
        "headers are ignored (uvicorn's FORWARDED_ALLOW_IPS is not used).",
    )
    metrics_token: str = Field(
        "", description="If set, `GET /metrics` needs `Authorization: Bearer TOKEN` (else 401)."
    )
    cors_origins: str = Field(
        "",
        description="Comma-separated origins allowed to call the API from a browser (CORS), "
        "or `*`; empty: no CORS headers.",
    )
    max_inflight_requests: int = Field(
        128,
        ge=1,
        description="Most translation requests in progress at once. Beyond it a request is "
        "refused with 429 from its headers alone, before its body is read: under overload the "
        "refusals stay fast and the admitted requests' wait stays bounded.",
    )
    max_body_bytes: int = Field(
        1_000_000, ge=1024, description="Largest request body in bytes (413 above it)."
    )
    body_read_timeout_s: float = Field(
        30.0,
        gt=0,
        description="Longest a translation request's body may take to arrive; 408 after it. "
        "Bodies are read before the request takes an in-flight slot, at most 4 per slot.",
    )
    body_min_bytes_per_s: int = Field(
        1024,
        ge=1,
        description="Slowest average rate a translation request's body may arrive at, from 5 "
        "s after the request's start; 408 below it.",
    )
    retry_after_s: int = Field(1, ge=1, description="Retry-After header value on 429/503.")
    alternatives_limit: int = Field(
        3,
        ge=0,
        description="Most `alternatives` a LibreTranslate /translate request may ask for (400 "
        "above it); alternatives come from the beam's n-best, so a request decodes with a beam "
        "of at least alternatives + 1 (capped by max_beam_size).",
    )
    max_glossary_entries: int = Field(
        5000,
        ge=1,
        description="Most entries in one glossary, inline or stored (413 above it).",
    )

    @field_validator("trusted_proxies")
    @classmethod
    def _proxies_parse(cls, value: str) -> str:
        # A bad entry stops the start, naming it.
        for entry in (part.strip() for part in value.split(",")):
            if entry:
                try:
                    ipaddress.ip_network(entry, strict=False)
                except ValueError:
                    raise ValueError(f"{entry!r} is neither an IP address nor a CIDR") from None
        return value


class ProcessSettings(BaseModel):
    """The process, its HTTP server and the web page."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    host: str = Field("0.0.0.0", description="Address the server listens on.")
    port: int = Field(8000, description="Port the server listens on.")
    shutdown_grace_s: float = Field(
        30.0, ge=0, description="SIGTERM: time to finish in-flight work."
    )
    log_level: str = Field("info", description="Log level (debug, info, warning, error).")
    log_format: Literal["text", "json"] = Field(
        "text",
        description="`json`: one JSON object per log line, and one per request with its id, "
        "route, status, model, latency, characters and client key id (a hash, never the key); "
        "uvicorn's access line is then left out.",
    )
    access_log: bool = Field(
        True,
        description="uvicorn's access log, a line per request. false: none (request ids, "
        "errors and /metrics stay), which frees a share of the event loop under load.",
    )
    frontend_timeout_ms: int = Field(
        500,
        ge=0,
        description="The web page waits this long after the last keystroke before it translates "
        "(LibreTranslate's frontendTimeout).",
    )

    process_mode: Literal["auto", "multi", "single"] = Field(
        "auto",
        description="`python -m service`: `multi` runs the HTTP front-ends and each model's "
        "engine cores as separate processes behind one port, under a supervisor that "
        "restarts any that dies; `single` serves everything from one process; `auto` is "
        "`multi` with a GPU or four CPUs or more, else `single` (which serves as much there).",
    )
    frontends: int = Field(
        0, ge=0, description="`multi`: HTTP front-end processes. 0: one per 4 CPUs (at least 1)."
    )
    engine_replicas: int = Field(
        0,
        ge=0,
        description="`multi`: engine-core processes per model, each with its own batch and "
        "intra_op_threads threads. 0: one per 4 CPUs left to the engines (at least 1; one on "
        "a GPU).",
    )


GROUPS: dict[str, type[BaseModel]] = {
    "model": ModelSettings,
    "scheduling": BatchingSettings,
    "limits": TextLimits,
    "access": AccessSettings,
    "storage": StorageSettings,
    "process": ProcessSettings,
}
# Each field's group: field names are unique across the groups, as the variables are.
GROUP_OF = {name: group for group, model in GROUPS.items() for name in model.model_fields}


def nest(fields: dict[str, Any]) -> dict[str, Any]:
    """Flat field names (``max_batch_rows``) moved into their groups, over what the group
    holds already; group names and unknown names stay (validation refuses unknown ones)."""
    nested = {name: value for name, value in fields.items() if name not in GROUP_OF}
    for name, value in fields.items():
        if (group := GROUP_OF.get(name)) is not None:
            held = nested.get(group) or {}
            held = held.model_dump() if isinstance(held, BaseModel) else held
            nested[group] = {**held, name: value}
    return nested


class FlatEnvSource(PydanticBaseSettingsSource):
    """Each group's fields from their flat ``MT_*`` variables, parsed as pydantic-settings
    parses any variable (case-insensitive; JSON for complex types unless ``NoDecode``)."""

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        return None, field_name, False  # __call__ reads whole groups

    def __call__(self) -> dict[str, Any]:
        present = {key.upper() for key in os.environ}
        for name in sorted(FIXED_NOW):
            if f"{ENV_PREFIX}{name}" in present:
                logger.warning(
                    "%s%s is no longer a setting and is ignored: the value is fixed (%s)",
                    ENV_PREFIX,
                    name,
                    FIXED_NOW[name],
                )
        values: dict[str, Any] = {}
        for group, model in GROUPS.items():
            source = EnvSettingsSource(
                model,  # type: ignore[arg-type]  # read as a settings class: fields and config
                case_sensitive=False,
                env_prefix=ENV_PREFIX,
            )
            if found := source():
                values[group] = found
        return values


class RenamedEnvSource(PydanticBaseSettingsSource):
    """The values of the variables in :data:`RENAMED`, under their new names, each with a
    warning that names the new variable. Below :class:`FlatEnvSource`: a new name wins. Of
    ``MT_MODEL_DIR`` and ``MT_MODEL_DIRS``, the list wins, as it always did."""

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        return None, field_name, False  # __call__ reads every renamed variable

    def __call__(self) -> dict[str, Any]:
        environment = {key.upper(): value for key, value in os.environ.items()}
        found: dict[str, Any] = {}
        # MODEL_DIRS after MODEL_DIR: the list replaces the single directory.
        for old_name, new_name in RENAMED.items():
            value = environment.get(f"{ENV_PREFIX}{old_name}")
            if value is None:
                continue
            logger.warning(
                "%s%s is deprecated; it is read as %s%s, its new name",
                ENV_PREFIX,
                old_name,
                ENV_PREFIX,
                new_name,
            )
            # A new name wins; an empty old one says nothing (``MT_MODEL_DIRS=`` beside
            # ``MT_MODEL_DIR`` meant that one directory).
            if f"{ENV_PREFIX}{new_name}" not in environment and value.strip():
                found[new_name.lower()] = value
        if not found:
            return {}
        # Parsed as the new variables are: through the group's own environment source.
        values: dict[str, Any] = {}
        for name, value in found.items():
            group = GROUP_OF[name]
            source = EnvSettingsSource(
                GROUPS[group],  # type: ignore[arg-type]  # read as a settings class
                case_sensitive=False,
                env_prefix=ENV_PREFIX,
            )
            field = GROUPS[group].model_fields[name]
            values.setdefault(group, {})[name] = source.prepare_field_value(
                name, field, value, source.field_is_complex(field)
            )
        return values


class Settings(BaseSettings):
    """The service's configuration, by group; ``Settings(max_batch_rows=7)`` takes flat field
    names as the environment does."""

    model_config = SettingsConfigDict(env_file=None, extra="forbid", frozen=True)

    model: ModelSettings = Field(default_factory=ModelSettings)
    scheduling: BatchingSettings = Field(default_factory=BatchingSettings)
    limits: TextLimits = Field(default_factory=TextLimits)
    access: AccessSettings = Field(default_factory=AccessSettings)
    storage: StorageSettings = Field(default_factory=StorageSettings)
    process: ProcessSettings = Field(default_factory=ProcessSettings)

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return init_settings, FlatEnvSource(settings_cls), RenamedEnvSource(settings_cls)

    @model_validator(mode="before")
    @classmethod
    def _nest_flat_fields(cls, data: Any) -> Any:
        return nest(data) if isinstance(data, dict) else data

    def replace(self, **fields: Any) -> Settings:
        """A copy with some fields replaced, by their flat names, validated (the environment
        is not read again)."""
        return type(self).model_validate({**{g: getattr(self, g) for g in GROUPS}, **fields})


@lru_cache
def get_settings() -> Settings:
    return Settings()
