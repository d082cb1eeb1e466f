"""Text normalisation as the MOSS-TTS processor does it: cases derived from its rules."""

from __future__ import annotations

import pytest

from moss_gguf_cli.tts.normalize import normalize_text

CASES = [
    # runs of spaces collapse; repeated ASCII punctuation becomes one full-width mark
    ("Hello,   world!!!  How are   you??", "Hello, world！How are you？"),
    # no spaces between CJK characters or around Chinese punctuation
    ("你 好 ， 世 界 ！", "你好，世界！"),
    # bold and italic marks are kept
    ("**Bold** and *italic* text", "**Bold** and *italic* text"),
    # heading, quote, bullet and numbered markers go; lines are joined with 。
    ("## Title\n\n> quote line\n* item one\n2) item two", "Title。quote line。item one。item two"),
    ("line1\r\nline2\n\n\nline3", "line1。line2。line3"),
    ("真的吗？？？！！！", "真的吗？！"),
    ("Really?! No!!", "Really？！No！"),
    ("Hello... world", "Hello。world"),
    # a word with punctuation inside is set aside; the run after it is not
    ("Wait...what?!?!", "Wait...what？！"),
    ("今天下雨了……好冷", "今天下雨了。好冷"),
    # one space between CJK and Latin, none between CJK and digits
    ("我有3个apple和2 个橘子", "我有3个 apple 和2个橘子"),
    # full-width letters, emoji, quotes and brackets are untouched
    ("ＡＢＣ１２３，全角文字", "ＡＢＣ１２３，全角文字"),
    ("I love 🍎 and 😀 emoji", "I love 🍎 and 😀 emoji"),
    ('He said "hi" (quietly) [laugh] {sad}', 'He said "hi" (quietly) [laugh] {sad}'),
    ("A -> B => C → D", "A，B，C，D"),
    ("Section one -- section two", "Section one。section two"),
    ("【注意】前方施工", "注意。前方施工"),
    ("《红楼梦》", "红楼梦"),
    ("I ,am here .", "I,am here."),
    ("foo\u200bbar\ttab", "foobar tab"),
    ("A  ,, B", "A，B"),
    ("Go---now", "Go---now"),
    ("see [the docs](https://example.com/a) now", "see the docs https://example.com/a now"),
    ("mail me@example.com at www.example.com...", "mail me@example.com at www.example.com..."),
    ("  \u3000 padded \u3000 ", "padded"),
]


@pytest.mark.parametrize("text, expected", CASES)
def test_normalize(text: str, expected: str) -> None:
    assert normalize_text(text) == expected


def test_normalize_is_idempotent() -> None:
    for text, expected in CASES:
        assert normalize_text(expected) == expected, text
