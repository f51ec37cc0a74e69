"""Language codes: the names the service knows (LibreTranslate's ``/languages`` shows names),
and the two spellings it accepts.

Clients name a language by ISO 639-1 (``de``) or by NLLB-200's code (``deu_Latn``: ISO 639-3
and the script). Inside the service every language has one canonical code: ISO 639-1 where
the language has one (so models of one pair, detection and multilingual models meet on the
same key), else the NLLB code spelt as NLLB spells it (``ace_Arab``). A request's codes are
read once, into a :class:`LanguagePair` of two :class:`LanguageCode` values, which carry
both: the canonical code, and the spelling responses use (the client's).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

AUTO = "auto"  # the source code that asks for detection

LANGUAGE_NAMES = {
    "af": "Afrikaans", "ak": "Akan", "am": "Amharic", "ar": "Arabic", "as": "Assamese",
    "ay": "Aymara", "az": "Azerbaijani", "ba": "Bashkir", "be": "Belarusian", "bg": "Bulgarian",
    "bm": "Bambara", "bn": "Bengali", "bo": "Tibetan", "bs": "Bosnian", "ca": "Catalan",
    "cs": "Czech", "cy": "Welsh", "da": "Danish", "de": "German", "dz": "Dzongkha", "ee": "Ewe",
    "el": "Greek", "en": "English", "eo": "Esperanto", "es": "Spanish", "et": "Estonian",
    "eu": "Basque", "fa": "Persian", "fi": "Finnish", "fj": "Fijian", "fo": "Faroese",
    "fr": "French", "ga": "Irish", "gd": "Scottish Gaelic", "gl": "Galician", "gn": "Guarani",
    "gu": "Gujarati", "ha": "Hausa", "he": "Hebrew", "hi": "Hindi", "hr": "Croatian",
    "ht": "Haitian Creole", "hu": "Hungarian", "hy": "Armenian", "id": "Indonesian",
    "ig": "Igbo", "is": "Icelandic", "it": "Italian", "ja": "Japanese", "jv": "Javanese",
    "ka": "Georgian", "kg": "Kongo", "ki": "Kikuyu", "kk": "Kazakh", "km": "Khmer",
    "kn": "Kannada", "ko": "Korean", "ks": "Kashmiri", "ku": "Kurdish", "ky": "Kyrgyz",
    "lb": "Luxembourgish", "lg": "Ganda", "li": "Limburgish", "ln": "Lingala", "lo": "Lao",
    "lt": "Lithuanian", "lv": "Latvian", "mg": "Malagasy", "mi": "Maori", "mk": "Macedonian",
    "ml": "Malayalam", "mn": "Mongolian", "mr": "Marathi", "ms": "Malay", "mt": "Maltese",
    "my": "Burmese", "nb": "Norwegian Bokmål", "ne": "Nepali", "nl": "Dutch",
    "nn": "Norwegian Nynorsk", "no": "Norwegian", "ny": "Chichewa", "oc": "Occitan",
    "om": "Oromo", "or": "Odia", "pa": "Punjabi", "pl": "Polish", "ps": "Pashto",
    "pt": "Portuguese", "qu": "Quechua", "rn": "Kirundi", "ro": "Romanian", "ru": "Russian",
    "rw": "Kinyarwanda", "sa": "Sanskrit", "sc": "Sardinian", "sd": "Sindhi", "sg": "Sango",
    "si": "Sinhala", "sk": "Slovak", "sl": "Slovenian", "sm": "Samoan", "sn": "Shona",
    "so": "Somali", "sq": "Albanian", "sr": "Serbian", "ss": "Swati", "st": "Southern Sotho",
    "su": "Sundanese", "sv": "Swedish", "sw": "Swahili", "ta": "Tamil", "te": "Telugu",
    "tg": "Tajik", "th": "Thai", "ti": "Tigrinya", "tk": "Turkmen", "tl": "Tagalog",
    "tn": "Tswana", "tr": "Turkish", "ts": "Tsonga", "tt": "Tatar", "tw": "Twi", "ug": "Uyghur",
    "uk": "Ukrainian", "ur": "Urdu", "uz": "Uzbek", "vi": "Vietnamese", "wo": "Wolof",
    "xh": "Xhosa", "yi": "Yiddish", "yo": "Yoruba", "zh": "Chinese", "zu": "Zulu",
}  # fmt: skip

# ISO 639-1 -> the NLLB-200 code that stands for it: the language's main variety and script
# (``zh`` is Simplified Chinese, ``ar`` Modern Standard Arabic, ``fa`` Western Persian). NLLB
# codes without an ISO 639-1 code of their own (``ace_Arab``, ``zho_Hant``) are their own
# canonical code.
NLLB_OF_ISO = {
    "af": "afr_Latn", "ak": "aka_Latn", "am": "amh_Ethi", "ar": "arb_Arab", "as": "asm_Beng",
    "ay": "ayr_Latn", "az": "azj_Latn", "ba": "bak_Cyrl", "be": "bel_Cyrl", "bg": "bul_Cyrl",
    "bm": "bam_Latn", "bn": "ben_Beng", "bo": "bod_Tibt", "bs": "bos_Latn", "ca": "cat_Latn",
    "cs": "ces_Latn", "cy": "cym_Latn", "da": "dan_Latn", "de": "deu_Latn", "dz": "dzo_Tibt",
    "ee": "ewe_Latn", "el": "ell_Grek", "en": "eng_Latn", "eo": "epo_Latn", "es": "spa_Latn",
    "et": "est_Latn", "eu": "eus_Latn", "fa": "pes_Arab", "fi": "fin_Latn", "fj": "fij_Latn",
    "fo": "fao_Latn", "fr": "fra_Latn", "ga": "gle_Latn", "gd": "gla_Latn", "gl": "glg_Latn",
    "gn": "grn_Latn", "gu": "guj_Gujr", "ha": "hau_Latn", "he": "heb_Hebr", "hi": "hin_Deva",
    "hr": "hrv_Latn", "ht": "hat_Latn", "hu": "hun_Latn", "hy": "hye_Armn", "id": "ind_Latn",
    "ig": "ibo_Latn", "is": "isl_Latn", "it": "ita_Latn", "ja": "jpn_Jpan", "jv": "jav_Latn",
    "ka": "kat_Geor", "kg": "kon_Latn", "ki": "kik_Latn", "kk": "kaz_Cyrl", "km": "khm_Khmr",
    "kn": "kan_Knda", "ko": "kor_Hang", "ks": "kas_Arab", "ku": "kmr_Latn", "ky": "kir_Cyrl",
    "lb": "ltz_Latn", "lg": "lug_Latn", "li": "lim_Latn", "ln": "lin_Latn", "lo": "lao_Laoo",
    "lt": "lit_Latn", "lv": "lvs_Latn", "mg": "plt_Latn", "mi": "mri_Latn", "mk": "mkd_Cyrl",
    "ml": "mal_Mlym", "mn": "khk_Cyrl", "mr": "mar_Deva", "ms": "zsm_Latn", "mt": "mlt_Latn",
    "my": "mya_Mymr", "nb": "nob_Latn", "ne": "npi_Deva", "nl": "nld_Latn", "nn": "nno_Latn",
    "ny": "nya_Latn", "oc": "oci_Latn", "om": "gaz_Latn", "or": "ory_Orya", "pa": "pan_Guru",
    "pl": "pol_Latn", "ps": "pbt_Arab", "pt": "por_Latn", "qu": "quy_Latn", "rn": "run_Latn",
    "ro": "ron_Latn", "ru": "rus_Cyrl", "rw": "kin_Latn", "sa": "san_Deva", "sc": "srd_Latn",
    "sd": "snd_Arab", "sg": "sag_Latn", "si": "sin_Sinh", "sk": "slk_Latn", "sl": "slv_Latn",
    "sm": "smo_Latn", "sn": "sna_Latn", "so": "som_Latn", "sq": "als_Latn", "sr": "srp_Cyrl",
    "ss": "ssw_Latn", "st": "sot_Latn", "su": "sun_Latn", "sv": "swe_Latn", "sw": "swh_Latn",
    "ta": "tam_Taml", "te": "tel_Telu", "tg": "tgk_Cyrl", "th": "tha_Thai", "ti": "tir_Ethi",
    "tk": "tuk_Latn", "tl": "tgl_Latn", "tn": "tsn_Latn", "tr": "tur_Latn", "ts": "tso_Latn",
    "tt": "tat_Cyrl", "tw": "twi_Latn", "ug": "uig_Arab", "uk": "ukr_Cyrl", "ur": "urd_Arab",
    "uz": "uzn_Latn", "vi": "vie_Latn", "wo": "wol_Latn", "xh": "xho_Latn", "yi": "ydd_Hebr",
    "yo": "yor_Latn", "zh": "zho_Hans", "zu": "zul_Latn",
}  # fmt: skip
ISO_OF_NLLB = {nllb: iso for iso, nllb in NLLB_OF_ISO.items()}
_NLLB_FORM = re.compile(r"^[A-Za-z]{3}_[A-Za-z]{4}$")


def is_nllb_form(code: str | None) -> bool:
    """Whether ``code`` is spelt as NLLB codes are (``deu_Latn``, in any case)."""
    return bool(_NLLB_FORM.match((code or "").strip()))


def normalise_language_code(code: str | None) -> str:
    """The canonical code: ``" De "`` → ``"de"``, ``"DEU_LATN"`` → ``"de"``, ``"ace_arab"`` →
    ``"ace_Arab"``, None → ``""``. Codes come in any case and with surrounding spaces, as
    LibreTranslate clients send them."""
    code = (code or "").strip()
    if is_nllb_form(code):
        nllb = f"{code[:3].lower()}_{code[4].upper()}{code[5:].lower()}"
        return ISO_OF_NLLB.get(nllb, nllb)
    return code.lower()


def nllb_code(code: str) -> str:
    """The NLLB spelling of a canonical code (``de`` → ``deu_Latn``); itself when none."""
    return NLLB_OF_ISO.get(code, code)


def language_name(code: str) -> str:
    """The English name of ``code``, or the code itself when it has none here."""
    return LANGUAGE_NAMES.get(code, code)


@dataclass(frozen=True)
class LanguageCode:
    """One language as a client named it: the canonical code, and whether the client spelt
    it as NLLB does (responses spell it back that way)."""

    code: str  # canonical; "" when the client named none
    nllb_spelt: bool = False

    @classmethod
    def parse(cls, sent: str | None) -> LanguageCode:
        """``" DEU_LATN "`` → ``de``, spelt as NLLB; None → ``""``."""
        return cls(normalise_language_code(sent), is_nllb_form(sent))

    @property
    def shown(self) -> str:
        """The code as responses spell it."""
        return nllb_code(self.code) if self.nllb_spelt else self.code


@dataclass(frozen=True)
class LanguagePair:
    """A request's source and target. The source's code is ``auto`` when it is to be detected;
    the target's is "" when the client named none (the only target served from the source)."""

    source: LanguageCode
    target: LanguageCode

    @classmethod
    def parse(cls, source: str | None, target: str | None) -> LanguagePair:
        """The codes as clients send them (any case, spaces around; none or "" for the
        source: detected)."""
        parsed = LanguageCode.parse(source)
        return cls(parsed if parsed.code else LanguageCode(AUTO), LanguageCode.parse(target))

    @classmethod
    def of(cls, source: str, target: str) -> LanguagePair:
        """A pair of canonical codes (a route's, a stored job's)."""
        return cls(LanguageCode(source), LanguageCode(target))

    @property
    def detects(self) -> bool:
        """Whether the source is to be detected."""
        return self.source.code == AUTO
