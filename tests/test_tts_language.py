"""Language names as upstream's apps write them: v1.5's 31 names, codes mapped to them, auto
omitted, anything else refused in one line (before any model is loaded)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from moss_gguf_cli.delay.language import LANGUAGES, language_name, languages
from moss_gguf_cli.errors import InputError

# upstream's LANGUAGE_TAG_CHOICES (clis/moss_tts_app.py at 58b20a0) without "Auto (omit)"
UPSTREAM_V15 = [
    "Chinese", "Cantonese", "English", "Arabic", "Czech", "Danish", "Dutch", "Finnish", "French",
    "German", "Greek", "Hebrew", "Hindi", "Hungarian", "Italian", "Japanese", "Korean",
    "Macedonian", "Malay", "Persian (Farsi)", "Polish", "Portuguese", "Romanian", "Russian",
    "Spanish", "Swahili", "Swedish", "Tagalog", "Thai", "Turkish", "Vietnamese",
]  # fmt: skip


def test_the_names_are_upstreams_v15_list() -> None:
    assert list(LANGUAGES) == UPSTREAM_V15
    assert [x.name for x in languages()] == UPSTREAM_V15


@pytest.mark.parametrize(
    "given, name",
    [
        ("en", "English"), ("EN-us", "English"), ("en_GB", "English"), ("eng", "English"),
        ("zh", "Chinese"), ("zh-CN", "Chinese"), ("zh-Hans-CN", "Chinese"), ("cmn", "Chinese"),
        ("yue", "Cantonese"), ("zh-HK", "Cantonese"), ("ja", "Japanese"), ("ko", "Korean"),
        ("fr", "French"), ("de", "German"), ("fa", "Persian (Farsi)"), ("farsi", "Persian (Farsi)"),
        ("fil", "Tagalog"), ("he", "Hebrew"), ("pt-BR", "Portuguese"), ("vi", "Vietnamese"),
        ("english", "English"), ("  German ", "German"), ("persian (farsi)", "Persian (Farsi)"),
    ],
)  # fmt: skip
def test_codes_and_names_become_names(given: str, name: str) -> None:
    assert language_name(given) == name


@pytest.mark.parametrize("given", [None, "", "auto", "AUTO", "Auto (omit)"])
def test_auto_or_absent_omits_the_tag(given) -> None:
    assert language_name(given) is None


@pytest.mark.parametrize("given", ["klingon", "xx", "en-", "zz-US", "English2"])
def test_unknown_is_one_line_listing_the_names(given: str) -> None:
    with pytest.raises(InputError) as err:
        language_name(given)
    line = err.value.one_line()
    assert "\n" not in line and repr(given) in line
    assert all(name in line for name in UPSTREAM_V15)


def test_synth_refuses_an_unknown_language_before_loading(tmp_path: Path) -> None:
    # no weights at all: the language is checked first, so the answer is about it alone
    proc = subprocess.run(
        [sys.executable, "-m", "moss_gguf_cli", "synth", "--config", str(tmp_path / "no.yaml"),
         "--text", "Hi", "--language", "klingon", "--output", str(tmp_path / "x.wav")],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "unknown language 'klingon'" in lines[0] and "Cantonese" in lines[0]
    assert not (tmp_path / "x.wav").exists()
