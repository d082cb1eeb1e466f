"""Language names for the prompt's `- Language:` field, as upstream's apps write them.

The models were trained with language *names* ("Chinese", "English"), not codes: upstream's
app offers the 31 names of `LANGUAGE_TAG_CHOICES` (`clis/moss_tts_app.py`, OpenMOSS/MOSS-TTS
58b20a0) and "Auto (omit)", which leaves the field as ``None``; its fine-tuning README says
"use language names such as Chinese, English, or French". Here a name (any case), a common
code (ISO 639-1 or -2/3, with or without a region: ``en``, ``en-US``, ``zh_CN``, ``yue``,
``fil``) or ``auto`` is accepted, and anything else is refused in one line listing the names.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..errors import InputError

AUTO = "auto"

# name → codes that mean it (first: the ISO 639-1 code where there is one)
_CODES: dict[str, tuple[str, ...]] = {
    "Chinese": ("zh", "zho", "chi", "cmn", "zh-cn", "zh-hans", "zh-sg", "zh-tw", "zh-hant",
                "mandarin"),
    "Cantonese": ("yue", "zh-hk", "zh-mo", "zh-yue"),
    "English": ("en", "eng"),
    "Arabic": ("ar", "ara"),
    "Czech": ("cs", "ces", "cze"),
    "Danish": ("da", "dan"),
    "Dutch": ("nl", "nld", "dut", "flemish"),
    "Finnish": ("fi", "fin"),
    "French": ("fr", "fra", "fre"),
    "German": ("de", "deu", "ger"),
    "Greek": ("el", "ell", "gre"),
    "Hebrew": ("he", "heb", "iw"),
    "Hindi": ("hi", "hin"),
    "Hungarian": ("hu", "hun"),
    "Italian": ("it", "ita"),
    "Japanese": ("ja", "jpn"),
    "Korean": ("ko", "kor"),
    "Macedonian": ("mk", "mkd", "mac"),
    "Malay": ("ms", "msa", "may", "zsm"),
    "Persian (Farsi)": ("fa", "fas", "per", "persian", "farsi"),
    "Polish": ("pl", "pol"),
    "Portuguese": ("pt", "por"),
    "Romanian": ("ro", "ron", "rum"),
    "Russian": ("ru", "rus"),
    "Spanish": ("es", "spa"),
    "Swahili": ("sw", "swa", "swh"),
    "Swedish": ("sv", "swe"),
    "Tagalog": ("tl", "tgl", "fil", "filipino"),
    "Thai": ("th", "tha"),
    "Turkish": ("tr", "tur"),
    "Vietnamese": ("vi", "vie"),
}  # fmt: skip

LANGUAGES: tuple[str, ...] = tuple(_CODES)  # upstream's order
_LOOKUP = {name.lower(): name for name in LANGUAGES} | {
    code: name for name, codes in _CODES.items() for code in codes
}
_AUTO_WORDS = {"", AUTO, "auto (omit)", "none"}


@dataclass(frozen=True)
class Language:
    name: str
    codes: tuple[str, ...]

    def to_dict(self) -> dict[str, object]:
        return {"object": "language", "name": self.name, "codes": list(self.codes)}


def languages() -> list[Language]:
    """The accepted names, in upstream's order, with the codes that stand for them."""
    return [Language(name, _CODES[name]) for name in LANGUAGES]


def language_name(value: str | None) -> str | None:
    """The name the prompt carries for VALUE; None (no tag) for absent or ``auto``.

    InputError (one line listing the names) for anything else.
    """
    if value is None:
        return None
    key = " ".join(str(value).split()).lower().replace("_", "-")
    if key in _AUTO_WORDS:
        return None
    found = _LOOKUP.get(key)
    if found is None and re.fullmatch(r"[a-z]{2,3}(-[a-z0-9]+)+", key):
        found = _LOOKUP.get(key.split("-")[0])  # en-US → en; zh-HK was looked up whole
    if found is None:
        raise InputError(
            f"unknown language {value!r}",
            hint=f"use auto, a code such as en, zh, yue, ja, ko, fr, de, or one of: "
            f"{', '.join(LANGUAGES)}",
        )
    return found
