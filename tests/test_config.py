"""The settings: every ``MT_*`` variable keeps its name and lands in its group's field, flat
keyword arguments set the same fields, the variables that became fixed bounds are ignored
with a warning, and docs/configuration.md is what the models generate."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from scripts.config_docs import configuration_markdown
from service.config import FIXED_NOW, GROUPS, RENAMED, Settings

ROOT = Path(__file__).resolve().parents[1]

# Every variable the service has documented, with a value other than its default, the field
# it must land in (group.field) and that value parsed. Written out, not derived from the
# models: renaming a field must fail here, since the variable's name would change with it.
VARIABLES = {
    "MT_EXPORTS": ("model.exports", "/a, /b", [Path("/a"), Path("/b")]),
    "MT_MODELS_DIR": ("model.models_dir", "/exports", Path("/exports")),
    "MT_MODELS": ("model.models", "opus-mt-en-fr, m2m100_418M", ["opus-mt-en-fr", "m2m100_418M"]),
    "MT_RELOAD_POLL_S": ("model.reload_poll_s", "2.5", 2.5),
    "MT_LOAD_ONLY": ("model.load_only", "en, de,fr", ["en", "de", "fr"]),
    "MT_SERVED_MODEL_NAME": ("model.served_model_name", "opus", "opus"),
    "MT_PROVIDER": ("model.provider", "cpu", "cpu"),
    "MT_INTRA_OP_THREADS": ("model.intra_op_threads", "3", 3),
    "MT_KV_POOL_MB": ("model.kv_pool_mb", "64", 64),
    "MT_VOCAB_SCREEN": ("model.vocab_screen", "false", False),
    "MT_CPU_INT8": ("model.cpu_int8", "false", False),
    "MT_LAZY_LOAD": ("model.lazy_load", "true", True),
    "MT_MAX_LOADED_MODELS": ("model.max_loaded_models", "2", 2),
    "MT_COLD_START": ("model.cold_start", "reject", "reject"),
    "MT_PIVOT_LANG": ("model.pivot_lang", "fr", "fr"),
    "MT_MODEL_FAIRNESS": ("model.model_fairness", "off", "off"),
    "MT_LANGUAGE_DETECTION": ("model.language_detection", "false", False),
    "MT_MAX_BATCH_ROWS": ("scheduling.max_batch_rows", "17", 17),
    "MT_MAX_BATCH_TOKENS": ("scheduling.max_batch_tokens", "4096", 4096),
    "MT_MAX_QUEUE": ("scheduling.max_queue", "9", 9),
    "MT_BATCHING": ("scheduling.batching", "static", "static"),
    "MT_STATIC_MAX_WAIT_MS": ("scheduling.static_max_wait_ms", "25", 25.0),
    "MT_ADMISSION_IDLE_WAIT_MS": ("scheduling.admission_idle_wait_ms", "5", 5.0),
    "MT_BACKGROUND_MAX_ROWS": ("scheduling.background_max_rows", "2", 2),
    "MT_BACKGROUND_MAX_WAIT_MS": ("scheduling.background_max_wait_ms", "250", 250.0),
    "MT_ADMISSION_COST_AWARE": ("scheduling.admission_cost_aware", "false", False),
    "MT_ADMISSION_MAX_TOKENS": ("scheduling.admission_max_tokens", "512", 512),
    "MT_ENCODER_OVERLAP": ("scheduling.encoder_overlap", "false", False),
    "MT_MAX_TEXTS_PER_REQUEST": ("limits.max_texts_per_request", "8", 8),
    "MT_MAX_CHARS_PER_TEXT": ("limits.max_chars_per_text", "100", 100),
    "MT_MAX_INPUT_TOKENS": ("limits.max_input_tokens", "64", 64),
    "MT_MAX_NEW_TOKENS": ("limits.max_new_tokens", "32", 32),
    "MT_OUTPUT_LENGTH_RATIO": ("limits.output_length_ratio", "1.5", 1.5),
    "MT_OUTPUT_LENGTH_SLACK": ("limits.output_length_slack", "4", 4),
    "MT_LENGTH_PENALTY": ("limits.length_penalty", "0.6", 0.6),
    "MT_MAX_BEAM_SIZE": ("limits.max_beam_size", "4", 4),
    "MT_DEFAULT_BEAM_SIZE": ("limits.default_beam_size", "2", 2),
    "MT_REQUEST_TIMEOUT_S": ("limits.request_timeout_s", "12.5", 12.5),
    "MT_TRANSLATION_CACHE_SIZE": ("limits.translation_cache_size", "100", 100),
    "MT_API_KEYS": ("access.api_keys", "k1,k2", "k1,k2"),
    "MT_API_KEYS_FILE": ("access.api_keys_file", "/etc/keys.json", Path("/etc/keys.json")),
    "MT_ADMIN_API_KEYS": ("access.admin_api_keys", "root", "root"),
    "MT_RATE_LIMIT_REQUESTS_PER_MINUTE": ("access.rate_limit_requests_per_minute", "60", 60),
    "MT_RATE_LIMIT_CHARS_PER_MINUTE": ("access.rate_limit_chars_per_minute", "500", 500),
    "MT_DEEPL_CHARACTER_LIMIT": ("access.deepl_character_limit", "1000", 1000),
    "MT_TRUSTED_PROXIES": ("access.trusted_proxies", "10.0.0.0/8", "10.0.0.0/8"),
    "MT_METRICS_TOKEN": ("access.metrics_token", "secret", "secret"),
    "MT_CORS_ORIGINS": ("access.cors_origins", "*", "*"),
    "MT_MAX_INFLIGHT_REQUESTS": ("access.max_inflight_requests", "16", 16),
    "MT_MAX_BODY_BYTES": ("access.max_body_bytes", "2048", 2048),
    "MT_BODY_READ_TIMEOUT_S": ("access.body_read_timeout_s", "10", 10.0),
    "MT_BODY_MIN_BYTES_PER_S": ("access.body_min_bytes_per_s", "100", 100),
    "MT_RETRY_AFTER_S": ("access.retry_after_s", "3", 3),
    "MT_ALTERNATIVES_LIMIT": ("access.alternatives_limit", "1", 1),
    "MT_MAX_GLOSSARY_ENTRIES": ("access.max_glossary_entries", "10", 10),
    "MT_DATA_DIR": ("storage.data_dir", "/var/mt", Path("/var/mt")),
    "MT_FILES_TRANSLATION": ("storage.files_translation", "false", False),
    "MT_FILES_DIR": ("storage.files_dir", "/var/files", Path("/var/files")),
    "MT_FILES_TTL_S": ("storage.files_ttl_s", "60", 60.0),
    "MT_DOCUMENT_JOBS": ("storage.document_jobs", "3", 3),
    "MT_DOCUMENT_TTL_S": ("storage.document_ttl_s", "3600", 3600.0),
    "MT_DATABASE_URL": (
        "storage.database_url",
        "postgresql://mt:pw@db:5432/mt",
        "postgresql://mt:pw@db:5432/mt",
    ),
    "MT_DOCUMENT_LEASE_S": ("storage.document_lease_s", "12", 12.0),
    "MT_HOST": ("process.host", "127.0.0.1", "127.0.0.1"),
    "MT_PORT": ("process.port", "9000", 9000),
    "MT_SHUTDOWN_GRACE_S": ("process.shutdown_grace_s", "5", 5.0),
    "MT_LOG_LEVEL": ("process.log_level", "debug", "debug"),
    "MT_LOG_FORMAT": ("process.log_format", "json", "json"),
    "MT_ACCESS_LOG": ("process.access_log", "false", False),
    "MT_FRONTEND_TIMEOUT_MS": ("process.frontend_timeout_ms", "100", 100),
    "MT_PROCESS_MODE": ("process.process_mode", "single", "single"),
    "MT_FRONTENDS": ("process.frontends", "3", 3),
    "MT_ENGINE_REPLICAS": ("process.engine_replicas", "2", 2),
}


def field(settings: Settings, path: str) -> object:
    group, name = path.split(".")
    return getattr(getattr(settings, group), name)


@pytest.fixture
def clean_env(monkeypatch):
    """No MT_* variable from the calling shell."""
    import os

    for name in [name for name in os.environ if name.upper().startswith("MT_")]:
        monkeypatch.delenv(name)
    return monkeypatch


def test_every_variable_lands_in_its_field(clean_env):
    defaults = Settings()
    for name, (_, raw, _) in VARIABLES.items():
        clean_env.setenv(name, raw)
    settings = Settings()
    for name, (path, _, expected) in VARIABLES.items():
        assert field(settings, path) == expected, name
        assert field(defaults, path) != expected, f"{name}: pick a value other than the default"


def test_every_field_has_a_variable_here_and_the_names_are_case_insensitive(clean_env):
    paths = {f"{group}.{name}" for group, model in GROUPS.items() for name in model.model_fields}
    assert paths == {path for path, _, _ in VARIABLES.values()}
    clean_env.setenv("mt_max_batch_rows", "5")
    assert Settings().scheduling.max_batch_rows == 5


def test_the_database_url_must_name_postgresql(clean_env):
    clean_env.setenv("MT_DATABASE_URL", "mysql://mt@db/mt")
    with pytest.raises(ValueError, match="database_url"):
        Settings()
    clean_env.setenv("MT_DATABASE_URL", "")  # empty: SQLite, as unset
    assert not Settings().storage.database_url


def test_flat_keywords_set_the_same_fields_and_win_over_the_environment(clean_env):
    clean_env.setenv("MT_MAX_BATCH_ROWS", "17")
    clean_env.setenv("MT_MAX_QUEUE", "9")
    settings = Settings(max_batch_rows=3, provider="cpu")
    assert (settings.scheduling.max_batch_rows, settings.scheduling.max_queue) == (3, 9)
    assert settings.model.provider == "cpu"
    replaced = settings.replace(port=1, exports=[])
    assert (replaced.process.port, replaced.scheduling.max_batch_rows) == (1, 3)
    with pytest.raises(ValueError, match="max_batch_rows"):
        Settings(max_batch_rows=0)
    with pytest.raises(ValueError, match="no_such_setting"):
        Settings(no_such_setting=1)


@pytest.mark.parametrize("name", sorted(FIXED_NOW))
def test_a_variable_that_became_a_fixed_bound_is_ignored_with_a_warning(clean_env, caplog, name):
    clean_env.setenv(f"MT_{name}", "3")
    with caplog.at_level(logging.WARNING, logger="service.config"):
        settings = Settings()
    assert settings == Settings.model_validate({})
    assert any(f"MT_{name} is no longer a setting" in r.message for r in caplog.records)


@pytest.mark.parametrize(
    ("old", "raw", "path", "expected"),
    [
        ("MT_MODEL_DIR", "/exports/one", "model.exports", [Path("/exports/one")]),
        ("MT_MODEL_DIRS", "/a, /b", "model.exports", [Path("/a"), Path("/b")]),
        ("MT_MODEL_NAME", "opus", "model.served_model_name", "opus"),
    ],
)
def test_a_renamed_variable_still_works_with_a_warning_naming_the_new_one(
    clean_env, caplog, old, raw, path, expected
):
    clean_env.setenv(old, raw)
    with caplog.at_level(logging.WARNING, logger="service.config"):
        settings = Settings()
    assert field(settings, path) == expected
    new = f"MT_{RENAMED[old.removeprefix('MT_')]}"
    assert any(old in r.message and new in r.message for r in caplog.records)


def test_a_new_name_wins_over_its_old_one_and_the_old_list_over_the_old_directory(clean_env):
    clean_env.setenv("MT_MODEL_DIR", "/one")
    clean_env.setenv("MT_MODEL_DIRS", "/a,/b")
    assert Settings().model.exports == [Path("/a"), Path("/b")]
    clean_env.setenv("MT_MODEL_DIRS", "")  # empty, as compose files set it: the directory
    assert Settings().model.exports == [Path("/one")]
    clean_env.setenv("MT_EXPORTS", "/new")
    assert Settings().model.exports == [Path("/new")]


def test_the_configuration_page_is_generated_from_the_models():
    page = (ROOT / "docs" / "configuration.md").read_text()
    assert page == configuration_markdown(), "stale: run python scripts/config_docs.py"
    for name in VARIABLES:
        assert f"`{name}`" in page
