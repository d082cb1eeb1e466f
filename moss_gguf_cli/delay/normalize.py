"""Text normalisation before tokenising: upstream MOSS-TTS v1.5's robustness rules.

The v1.5 processor cleans the text field with `normalize_tts_text`
(`moss_tts_delay/tts_robust_normalizer_single_script.py`, OpenMOSS/MOSS-TTS 58b20a0); the model
was trained on text cleaned so. This module gives the same output on every case of
tests/data/upstream_normalize.json (upstream's TEST_CASES, our own, and generated mixtures),
written here from the rules, not copied. It is a robustness cleaner, not a reader: numbers,
units, dates, brackets and ``[S1]``/``{sad}``-style tags are left as they are. Only the text to
speak is normalised (``--no-normalize`` turns it off). The rules, in order:

1. clean-up: CR/CRLF → LF, ideographic space → space, control/format/private characters
   dropped (newline and tab kept);
2. lines: markdown links ``[t](url)`` → ``t url``; each line stripped, empty lines dropped, a
   heading / quote / bullet / numbered-list marker at its start removed; lines joined with 。;
3. tokens the punctuation rules must not touch are set aside: URLs, e-mail addresses,
   @mentions, ``u/`` ``r/`` names, #hashtags (up to the next space or #), dot-names (``.env``)
   and file-like words with a letter and one of ``._/+:-`` (``v2.3.1``, ``app.js.map``);
4. spaces: runs → one; none inside CJK (Han and kana) text or between CJK and digits; one
   between CJK and a Latin word or set-aside token; none around Chinese punctuation or before
   ``,.;!?``;
5. structure: ``【x】`` ``〖x〗`` ``『x』`` ``「x」`` at the start or after a sentence end → ``x。``
   (twice, so a chain of two converges); a ``《title》`` standing alone loses its brackets;
   arrows → ，; runs of two or more dashes → 。 (a single dash, – or — stays);
6. repeated punctuation: ``...`` and ``……`` → 。 (a single … stays); runs of 。 ，! ? → one
   full-width mark; a mixed ?! run → ？！;
7. spaces again, set-aside tokens back, ends stripped.

Where upstream's placeholders leak (a hashtag or dot-name running into a set-aside token
leaves ``___PROT0___`` in its output), the tokens are put back here; the golden data records
both (tests/data/upstream_normalize.json, ``upstream_raw``).
"""

from __future__ import annotations

import re
import unicodedata

# a set-aside token stands in the text as upstream's placeholder spells it: its underscores,
# letters and digits take part in the rules around it (after an e-mail address, ":" before
# kana gets a space), so another spelling would give other text
_SLOT = r"___PROT(\d+)___"
_WORD = "A-Za-z0-9_"  # what may not touch a set-aside token's edge
_CJK = "[\u3400-\u4dbf\u4e00-\u9fff\u3040-\u30ff]"  # Han and kana: no spaces between words
_LATIN_RUN = "[A-Za-z0-9._/+:-]"
# a Latin word (a letter somewhere in it) or a set-aside token, next to CJK text
_LATINISH = f"(?:___PROT\\d+___|(?={_LATIN_RUN}*[A-Za-z])[A-Za-z0-9]{_LATIN_RUN}*)"
_SENTENCE_END = "[。！？!?；;]"

_SET_ASIDE = [
    re.compile(r"https?://[^\s\u3000，。！？；、）】》〉」』]+"),
    re.compile(r"(?<![\w.+-])[A-Za-z0-9._%+-]+@[A-Za-z0-9.-]+\.[A-Za-z]{2,}(?![\w.-])"),
    re.compile(rf"(?<![{_WORD}])@[A-Za-z0-9_]{{1,32}}"),
    re.compile(rf"(?<![{_WORD}])[ur]/[A-Za-z0-9_]+"),
    re.compile(rf"(?<![{_WORD}])#(?!\s)[^\s#]+"),
    re.compile(rf"(?<![{_WORD}])\.(?=[A-Za-z0-9._-]*[A-Za-z0-9])[A-Za-z0-9._-]+"),
    re.compile(
        rf"(?<![{_WORD}])(?={_LATIN_RUN}*[A-Za-z])(?={_LATIN_RUN}*[._/+:-])"
        rf"[A-Za-z0-9](?:{_LATIN_RUN}*[A-Za-z0-9])?(?![{_WORD}])"
    ),
]

_LINK = re.compile(r"\[([^\[\]]+?)\]\((https?://[^)\s]+)\)")
_LINE_MARKS = [re.compile(p) for p in (r"^#{1,6}\s+", r"^>\s+", r"^[-*+]\s+", r"^\d+[.)]\s+")]

_SPACE_RULES = [
    (re.compile(r"[ \t\r\f\v]+"), " "),
    (re.compile(rf"({_CJK})\s+(?={_CJK})"), r"\1"),
    (re.compile(rf"({_CJK})\s+(?=\d)"), r"\1"),
    (re.compile(rf"(\d)\s+(?={_CJK})"), r"\1"),
    (re.compile(rf"({_CJK})(?={_LATINISH})"), r"\1 "),
    (re.compile(rf"({_LATINISH})(?={_CJK})"), r"\1 "),
    (re.compile(r" {2,}"), " "),
    (re.compile(r"\s+([，。！？；：、”’」』】）》])"), r"\1"),
    (re.compile(r"([（【「『《“‘])\s+"), r"\1"),
    (re.compile(r"([，。！？；：、])\s*"), r"\1"),
    (re.compile(r"\s+([,.;!?])"), r"\1"),
    (re.compile(r" {2,}"), " "),
]

_BOXED = re.compile(rf"(^|{_SENTENCE_END}\s*)[【〖『「]([^】〗』」]+)[】〗』」]\s*")
_TITLE_ALONE = re.compile(
    rf"(^|{_SENTENCE_END}\s*)《([^》]+)》(?=\s*(?:___PROT\d+___|[—–―-]{{2,}}|$|[。！？!?；;，,]))"
)
_ARROW = re.compile(r"\s*(?:<[-=]+>|[-=]+>|<[-=]+|[→←↔⇒⇐⇔⟶⟵⟷⟹⟸⟺↦↤↪↩])\s*")
_DASH_RUN = re.compile(r"\s*[—–―-]{2,}\s*")

_REPEATS = [
    (re.compile(r"\.{3,}|…{2,}"), "。"),
    (re.compile(r"[。．]{2,}"), "。"),
    (re.compile(r"[，,]{2,}"), "，"),
    (re.compile(r"[!！]{2,}"), "！"),
    (re.compile(r"[?？]{2,}"), "？"),
]
_MIXED_MARKS = re.compile(r"[!?！？]{2,}")


def _clean(text: str) -> str:
    text = text.replace("\r\n", "\n").replace("\r", "\n").replace("\u3000", " ")
    return "".join(
        ch for ch in text
        if ch in "\n\t " or not unicodedata.category(ch).startswith("C")
    )  # fmt: skip


def _lines(text: str) -> str:
    kept = []
    for line in _LINK.sub(r"\1 \2", text).splitlines():
        line = line.strip()
        if not line:
            continue
        for mark in _LINE_MARKS:  # in turn: "> - item" loses both
            line = mark.sub("", line)
        kept.append(line)
    return "。".join(kept)


def _spaces(text: str) -> str:
    for pattern, replacement in _SPACE_RULES:
        text = pattern.sub(replacement, text)
    return text.strip()


def _structure(text: str) -> str:
    for _ in range(2):  # 【a】【b】: the second box is at a sentence start only after the first
        text = _BOXED.sub(r"\1\2。", text)
    text = _TITLE_ALONE.sub(r"\1\2", text)
    text = _ARROW.sub("，", text)
    return _DASH_RUN.sub("。", text)


def _one_mark(match: re.Match[str]) -> str:
    run = match.group(0)
    question = any(ch in "?？" for ch in run)
    exclaim = any(ch in "!！" for ch in run)
    return "？！" if question and exclaim else ("？" if question else "！")


def _repeats(text: str) -> str:
    for pattern, replacement in _REPEATS:
        text = pattern.sub(replacement, text)
    return _MIXED_MARKS.sub(_one_mark, text)


def normalize_text(text: str) -> str:
    """The text to speak, cleaned as upstream v1.5's processor cleans it."""
    text = _lines(_clean(text))
    aside: list[str] = []

    def set_aside(match: re.Match[str]) -> str:
        aside.append(match.group(0))
        return f"___PROT{len(aside) - 1}___"

    for pattern in _SET_ASIDE:
        text = pattern.sub(set_aside, text)
    text = _spaces(_repeats(_structure(_spaces(text))))
    slot = re.compile(_SLOT)
    for _ in aside:  # a token set aside inside a later one comes back too
        if not slot.search(text):
            break
        text = slot.sub(lambda m: aside[int(m.group(1))], text)
    return text.strip()


# ---------------------------------------------------------------- MOSS-TTSD dialogues

# upstream's TTSD app (clis/moss_ttsd_app.py, `normalize_text`) cleans a dialogue before the
# processor's rules run on it: per speaker turn, brackets, quotes, dashes and tildes go, long
# pauses and list marks become commas, laughter becomes a tag, and a turn of the same speaker
# as the one before joins it
_TURN = re.compile(r"(?=\[S\d+\])")
_TAGGED = re.compile(r"^(\[S\d+\])\s*(.*)")
_DROPPED = re.compile("[" + re.escape('【】《》（）『』「」"-_“”～~‘’') + "]")
_PAUSES = ("——", "……", "...", "⸺", "―", "—", "…")
_LIST_MARKS = str.maketrans({"；": "，", ";": ",", "：": "，", ":": ",", "、": "，"})
_MARK_RUN = re.compile(r"([，。？！,.?!])[，。？！,.?!]+")


def _turn_text(content: str) -> str:
    content = _DROPPED.sub("", content)
    content = re.sub(r"哈{2,}", "[笑]", content)
    content = re.sub(r"\b(ha(\s*ha)+)\b", "[laugh]", content, flags=re.IGNORECASE)
    for pause in _PAUSES:
        content = content.replace(pause, "，")
    content = _MARK_RUN.sub(r"\1", content.translate(_LIST_MARKS).strip())
    if len(content) > 1:  # full stops inside a turn become commas; a trailing comma, a stop
        last = {"，": "。", ",": "."}.get(content[-1], content[-1])
        content = content[:-1].replace("。", "，") + last
    return content


def normalize_dialogue(text: str) -> str:
    """A ``[S1]… [S2]…`` dialogue cleaned as upstream's MOSS-TTSD app cleans it (``[1]`` is
    read as ``[S1]``); `normalize_text` runs on the result afterwards, as the processor's."""
    text = re.sub(r"\[(\d+)\]", r"[S\1]", text).replace("\n", " ")
    turns: list[tuple[str, str]] = []
    for piece in _TURN.split(text):
        piece = piece.strip()
        if not piece:
            continue
        tagged = _TAGGED.match(piece)
        tag, content = tagged.groups() if tagged else ("", piece)
        content = _turn_text(content)
        if turns and tag and turns[-1][0] == tag:
            turns[-1] = (tag, turns[-1][1] + content)
        else:
            turns.append((tag, content))
    return "".join(f"{tag}{content}".strip() for tag, content in turns)


def merge_turns(text: str) -> str:
    """Consecutive turns of one speaker joined under one tag (``[S1]a[S1]b`` → ``[S1]ab``)."""
    out, current = [], None
    for piece in _TURN.split(text):
        piece = piece.strip()
        if not piece:
            continue
        tagged = re.match(r"^(\[S\d+\])\s*(.*)", piece, re.DOTALL)
        if not tagged:
            out.append(piece)
        elif tagged.group(1) == current:
            out.append(tagged.group(2))
        else:
            current = tagged.group(1)
            out.append(current + tagged.group(2))
    return "".join(out)
