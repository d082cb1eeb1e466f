"""Text normalisation before tokenising, as the MOSS-TTS Hugging Face processor does it.

The model was trained on text cleaned this way, so real-world text (markdown, stray line
breaks, runs of punctuation) is spoken as the reference implementation speaks it. Only the
text to speak is normalised; instruction, quality and the other prompt fields are not, and
``--no-normalize`` turns it off. The rules, in order:

1. clean-up: CR/CRLF → LF, ideographic space → space, zero-width and other control/format
   characters dropped (newline and tab kept);
2. lines: markdown links ``[t](url)`` → ``t url``; each line stripped, empty lines dropped,
   a heading / quote / bullet / numbered-list marker at its start removed; lines joined
   with ``。`` (bold and italic marks stay);
3. tokens that punctuation rules must not touch are set aside: URLs, e-mail addresses,
   @names, ``u/`` ``r/`` names, #tags, dot-files, and words with a letter and ``._/+:-``
   inside (``v2.3.1``, ``a.js``, ``Wait...what``, ``3.2s``);
4. spaces: runs → one; none between CJK characters or CJK and digits; one between CJK and
   Latin text or a set-aside token; none around Chinese punctuation or before ``,.;!?``;
5. structure: ``【x】`` ``〖x〗`` ``『x』`` ``「x」`` at the start or after a sentence end
   → ``x。``; a ``《title》`` standing alone loses its brackets; arrows → ``，``;
   dash runs → ``。``;
6. repeated punctuation: ellipses → ``。``, runs of ``。`` ``，`` ``！`` ``？`` → one
   (full-width), mixed ``?!`` runs → ``？！``;
7. spaces again, set-aside tokens back, ends stripped.

Numbers, full-width letters, emoji, quotes and brackets are left as they are.
"""

from __future__ import annotations

import re
import unicodedata

_CJK = r"\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff"
_ZH_PUNCT = "，。！？；：、（）【】《》〈〉「」『』〖〗“”‘’"
_KEEP_CONTROL = {"\n", "\t", " "}

_LINK = re.compile(r"\[([^\]\n]+)\]\((https?://[^)\s]+)\)")
_LINE_MARK = re.compile(r"^(?:#{1,6}\s+|>\s+|[-*+]\s+|\d+[.)]\s+)")
_PROTECT = re.compile(
    r"https?://\S+|www\.\S+"  # URLs
    r"|[\w.+-]+@[\w-]+(?:\.[\w-]+)+"  # e-mail
    r"|(?<![\w@])@\w+"  # @name
    r"|\b[ur]/\w+"  # u/name, r/name
    r"|(?<![\w#])#\w+"  # #tag
    r"|(?<![\w.])\.[A-Za-z0-9_][\w.-]*"  # .env
    r"|(?=[\w.+/:-]*[A-Za-z])[\w]+(?:[._/+:-]+[\w]+)+"  # v2.3.1, a.js, Wait...what
)
_ARROW = re.compile(r"\s*(?:->|=>|<-|<=|→|⇒|←|⇐|⟶|⟹|‹-)\s*")
_DASHES = re.compile(r"\s*(?:—{2,}|-{2,}|–+|—)\s*")


def _clean(text: str) -> str:
    text = text.replace("\r\n", "\n").replace("\r", "\n").replace("\u3000", " ")
    return "".join(
        ch for ch in text
        if ch in _KEEP_CONTROL or not unicodedata.category(ch).startswith("C")
    )  # fmt: skip


def _lines(text: str) -> str:
    text = _LINK.sub(r"\1 \2", text)
    lines = []
    for line in text.split("\n"):
        line = _LINE_MARK.sub("", line.strip()).strip()
        if line:
            lines.append(line)
    return "。".join(lines)


def _spaces(text: str) -> str:
    text = re.sub(r"[ \t]+", " ", text)
    cjk, latin = f"[{_CJK}]", r"[A-Za-z\x00\x01]"  # \x00…\x01: a set-aside token
    text = re.sub(rf"(?<={cjk}) (?={cjk})", "", text)
    text = re.sub(rf"(?<={cjk}) (?=\d)|(?<=\d) (?={cjk})", "", text)
    text = re.sub(rf"(?<={cjk}) ?(?={latin})", " ", text)
    text = re.sub(rf"(?<={latin}) ?(?={cjk})", " ", text)
    text = re.sub(rf" *([{_ZH_PUNCT}]) *", r"\1", text)
    text = re.sub(r" +([,.;!?])", r"\1", text)
    return text


def _structure(text: str) -> str:
    text = re.sub(r"(^|[。！？!?.；;])\s*[【〖『「]([^】〗』」]+)[】〗』」]", r"\1\2。", text)
    text = re.sub(r"^《([^》]+)》$", r"\1", text)
    text = re.sub(r"(^|[。！？!?])《([^》]+)》(?=$|[。！？!?])", r"\1\2", text)
    text = _ARROW.sub("，", text)
    return _DASHES.sub("。", text)


def _repeats(text: str) -> str:
    text = re.sub(r"\.{3,}|…+", "。", text)
    text = re.sub(r"(?:[?？]+[!！]+)+[?？!！]*", "？！", text)
    text = re.sub(r"(?:[!！]+[?？]+)+[?？!！]*", "？！", text)
    text = re.sub(r"[。．]{2,}", "。", text)
    text = re.sub(r"[，,]{2,}", "，", text)
    text = re.sub(r"[!！]{2,}", "！", text)
    text = re.sub(r"[?？]{2,}", "？", text)
    return text


def normalize_text(text: str) -> str:
    """The text to speak, normalised as the reference processor normalises it."""
    text = _lines(_clean(text))
    kept: list[str] = []

    def aside(m: re.Match) -> str:
        kept.append(m.group(0))
        return f"\x00{len(kept) - 1}\x01"

    text = _PROTECT.sub(aside, text)
    text = _repeats(_structure(_spaces(text)))
    text = _spaces(text)
    text = re.sub(r"\x00(\d+)\x01", lambda m: kept[int(m.group(1))], text)
    return text.strip()
