"""Language codes the service knows by name (LibreTranslate's ``/languages`` shows names)."""

from __future__ import annotations

LANGUAGE_NAMES = {
    "ar": "Arabic", "cs": "Czech", "da": "Danish", "de": "German", "el": "Greek",
    "en": "English", "es": "Spanish", "fi": "Finnish", "fr": "French", "hu": "Hungarian",
    "it": "Italian", "ja": "Japanese", "ko": "Korean", "nl": "Dutch", "no": "Norwegian",
    "pl": "Polish", "pt": "Portuguese", "ro": "Romanian", "ru": "Russian", "sv": "Swedish",
    "tr": "Turkish", "uk": "Ukrainian", "zh": "Chinese",
}  # fmt: skip


def normalise_language_code(code: str | None) -> str:
    """``" De "`` → ``"de"``, None → ``""``: codes in any case and with surrounding spaces,
    as LibreTranslate clients send them."""
    return (code or "").strip().lower()


def language_name(code: str) -> str:
    """The English name of ``code``, or the code itself when it has none here."""
    return LANGUAGE_NAMES.get(code, code)
