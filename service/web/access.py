"""Who may translate, and how much: API keys and per-client rate limits. Off by default.

* **API keys** are on when ``MT_API_KEYS`` (comma-separated) or ``MT_API_KEYS_FILE`` (JSON:
  ``{"key": {"requests_per_minute": 60, "chars_per_minute": 50000}, ...}``) names any. A key
  comes as ``Authorization: Bearer KEY`` (or ``DeepL-Auth-Key KEY``) or, on the LibreTranslate route, as its ``api_key``
  field (header first). Errors use LibreTranslate's texts: an unknown key is 403 ``Invalid API
  key``; a missing one is 401 ``Please contact the server operator to get an API key`` (with
  ``WWW-Authenticate: Bearer``; LibreTranslate says 400 there, but a missing credential is
  what 401 is for).
* **Rate limits** are on when ``MT_RATE_LIMIT_REQUESTS_PER_MINUTE`` or
  ``MT_RATE_LIMIT_CHARS_PER_MINUTE`` is above 0 (or a key has limits of its own): requests
  and characters per minute over a moving window, counted per API key, or per client address
  for callers without one. A refusal is 429 with ``Retry-After`` (when there will be room) and
  LibreTranslate's ``Slowdown: ...`` text; a request with more characters than a whole
  minute's allowance can never pass and is 413.

* **Owners.** With keys on, what a key stores is its own (service/storage/owners.py);
  an admin key (``MT_ADMIN_API_KEYS``) stores into the shared space, which every key reads.

Checked after the body is parsed (the key and the character count may be in it) and before
any text work, so a refused request costs no tokenizing.
"""

from __future__ import annotations

import hmac
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from fastapi import Request

from service.config import Settings
from service.storage.owners import SHARED, Owner, key_owner
from service.web.errors import ApiError
from service.web.rate_limits import Clock, RateLimiter, Refusal
from service.web.request_log import note_client

INVALID_KEY = "Invalid API key"
# Routes whose clients may send the key in the body (LibreTranslate's ``api_key`` field).
BODY_KEY_ROUTES = frozenset({"/translate", "/detect", "/translate_file"})
MISSING_KEY = "Please contact the server operator to get an API key"
UNAUTHORIZED = "Unauthorized"


class Limiter(Protocol):
    def charge(
        self, identity: str, *, chars: int, requests_per_minute: int, chars_per_minute: int
    ) -> Refusal | None: ...


@dataclass(frozen=True)
class ClientLimits:
    requests_per_minute: int = 0  # 0: no limit
    chars_per_minute: int = 0


def load_api_keys(settings: Settings) -> dict[str, ClientLimits]:
    """Every configured key with its limits (the global ones unless the file gives its own)."""
    default = ClientLimits(
        settings.access.rate_limit_requests_per_minute, settings.access.rate_limit_chars_per_minute
    )
    listed = f"{settings.access.api_keys},{settings.access.admin_api_keys}"
    keys = {key.strip(): default for key in listed.split(",") if key.strip()}
    if settings.access.api_keys_file is not None:
        entries = json.loads(Path(settings.access.api_keys_file).read_text())
        if not isinstance(entries, dict):
            raise ValueError("MT_API_KEYS_FILE must hold a JSON object: key -> limits")
        for key, limits in entries.items():
            limits = limits or {}
            keys[key] = ClientLimits(
                int(limits.get("requests_per_minute", default.requests_per_minute)),
                int(limits.get("chars_per_minute", default.chars_per_minute)),
            )
    return keys


def bearer_token(request: Request) -> str | None:
    """The key of ``Authorization: Bearer KEY`` or of DeepL's ``DeepL-Auth-Key KEY`` (its
    client libraries send only that), so one set of keys serves every API."""
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    return token.strip() or None if scheme.lower() in ("bearer", "deepl-auth-key") else None


class AccessPolicy:
    """The service's keys and limits; ``admit`` is called by the translation routes."""

    def __init__(
        self, settings: Settings, clock: Clock = time.time, limiter: Limiter | None = None
    ) -> None:
        """``limiter``: where the windows live (in this process unless given: the
        multi-process service shares them between its front-ends)."""
        self.keys = load_api_keys(settings)
        self.admin_keys = {
            k.strip() for k in settings.access.admin_api_keys.split(",") if k.strip()
        }
        self.anonymous_limits = ClientLimits(
            settings.access.rate_limit_requests_per_minute,
            settings.access.rate_limit_chars_per_minute,
        )
        self.limiter = limiter if limiter is not None else RateLimiter(clock)
        self.retry_after_s = settings.access.retry_after_s

    @property
    def keys_required(self) -> bool:
        return bool(self.keys)

    def admit(self, request: Request, body_key: str | None, chars: int) -> Owner:
        """Whose stored glossaries, memories and documents the request sees, once it is
        admitted; ``ApiError`` (401, 403 or 429) unless it may be served now."""
        identity, limits = self._identify(request, body_key)
        note_client(identity.removeprefix("key:") if identity.startswith("key:") else None, chars)
        self._charge(identity, limits, requests=1, chars=chars)
        return self._owner(identity)

    def identity(self, request: Request) -> str:
        """Whom usage is counted for (DeepL's quota, service/web/quota.py): the API key, or
        the client's address when keys are off; 401 or 403 as ``admit``."""
        return self._identify(request, None)[0]

    def refusal_from_headers(self, path: str, authorization: str) -> ApiError | None:
        """The 401 or 403 a request gets from its headers alone, before its body is read:
        a key in the header that is not one, or no key on a route whose clients cannot send
        one in the body (the LibreTranslate routes can: ``api_key``). None: read on."""
        if not self.keys_required:
            return None
        scheme, _, token = authorization.partition(" ")
        key = token.strip() if scheme.lower() in ("bearer", "deepl-auth-key") else ""
        deepl = path.startswith("/v2/")
        if key:
            if key in self.keys:
                return None
            return ApiError(403, "invalid_api_key", INVALID_KEY)
        if path in BODY_KEY_ROUTES:
            return None
        if deepl:
            return ApiError(403, "invalid_api_key", "Authorization failure: no key")
        return ApiError(401, "api_key_required", MISSING_KEY, {"WWW-Authenticate": "Bearer"})

    def _owner(self, identity: str) -> Owner:
        """Whose stored items ``identity`` sees: keys off, the shared space, as one trusted
        client; an admin key, the shared space too; any other key, its own and the shared."""
        if not self.keys_required:
            return SHARED
        key = identity.removeprefix("key:")
        return SHARED if key in self.admin_keys else key_owner(key)

    def charge_characters(self, request: Request, body_key: str | None, chars: int) -> None:
        """Count characters known only after the request was admitted (a file's texts, once
        parsed) against the same per-minute allowance: 429 or 413 as ``admit`` would."""
        identity, limits = self._identify(request, body_key)
        note_client(None, chars)
        self._charge(identity, limits, requests=0, chars=chars)

    def _identify(self, request: Request, body_key: str | None) -> tuple[str, ClientLimits]:
        """Who is asking, and their limits; 401 or 403 when keys are required."""
        key = bearer_token(request) or body_key or None
        if self.keys_required:
            if key is None:
                raise ApiError(401, "api_key_required", MISSING_KEY, {"WWW-Authenticate": "Bearer"})
            limits = self.keys.get(key)
            if limits is None:
                raise ApiError(403, "invalid_api_key", INVALID_KEY)
            identity = f"key:{key}"
        else:
            # Keys are off: one given is ignored, as LibreTranslate does.
            limits = self.anonymous_limits
            identity = f"client:{request.client.host if request.client else 'unknown'}"
        return identity, limits

    def _charge(self, identity: str, limits: ClientLimits, *, requests: int, chars: int) -> None:
        if not (limits.requests_per_minute or limits.chars_per_minute):
            return
        refusal = self.limiter.charge(
            identity,
            chars=chars,
            requests_per_minute=limits.requests_per_minute if requests else 0,
            chars_per_minute=limits.chars_per_minute,
        )
        if refusal is None:
            return
        if refusal.retry_after_s is None:  # larger than a whole minute's allowance
            raise ApiError(413, "over_rate_limit", f"Slowdown: {refusal.message}")
        raise ApiError(
            429,
            "rate_limited",
            f"Slowdown: {refusal.message}",
            {"Retry-After": str(refusal.retry_after_s)},
        )


def check_metrics_token(request: Request, token: str) -> None:
    """``/metrics`` with ``MT_METRICS_TOKEN`` set: ``Authorization: Bearer TOKEN`` or 401."""
    given = bearer_token(request) or ""
    if not hmac.compare_digest(given.encode(), token.encode()):
        raise ApiError(401, "unauthorized", UNAUTHORIZED, {"WWW-Authenticate": "Bearer"})
