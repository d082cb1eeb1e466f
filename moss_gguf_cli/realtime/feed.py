"""Text that grows while it is spoken: an LLM's deltas, a WebSocket's pieces, stdin as it comes.

Pieces are appended to one text, and the whole text is tokenized again after each (as
upstream's TextDeltaTokenizer does): a token at the end may still change as more text comes
("Hel" + "lo"), so the last HOLD_BACK tokens are held back until more arrives or the input
ends; the ones given out never change. Once the input ends, every token is out and the ids are
the whole text's (unless a token already given out was changed by text after it, which the
hold-back makes rare; upstream's rule too). The writer (the event loop, a reader thread) and
the reader (the serve core's worker) are different threads: one lock, and a condition the
reader waits on; WAKE, where given, is set on every change (a worker serving several feeds
waits on one event).
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from ..errors import InputError, TooMuchText

HOLD_BACK = 3  # upstream's default


class TextFeed:
    """The text so far (`push`), ended by `end`; `ids` the stable token ids, `ended` once
    closed. MAX_CHARS bounds the whole text (a piece past it is refused, nothing taken)."""

    def __init__(self, encode: Callable[[str], list[int]], max_chars: int,
                 hold_back: int = HOLD_BACK, wake: threading.Event | None = None):  # fmt: skip
        self._encode, self.max_chars, self.hold_back = encode, max_chars, hold_back
        self._wake = wake
        self._text = ""
        self._given: list[int] = []  # ids given out: never taken back
        self.ended = False
        self.cut: str | None = None  # why the writer stopped taking text early, if it did
        self._changed = threading.Condition()

    @property
    def text(self) -> str:
        return self._text

    @property
    def ids(self) -> list[int]:
        with self._changed:
            return list(self._given)

    def push(self, piece: str) -> None:
        """More text; InputError (nothing taken) if the input ended, the text would pass
        max_chars, or the piece is not text the tokenizer takes."""
        with self._changed:
            if self.ended:
                raise InputError("the text has ended; no more can be added")
            if len(self._text) + len(piece) > self.max_chars:
                raise TooMuchText(f"the text would pass {self.max_chars} characters",
                                 hint="end this input and start another")  # fmt: skip
            if not piece:
                return
            text = self._text + piece
            ids = self._tokens(text)
            self._text = text
            stop = max(len(self._given), len(ids) - self.hold_back)  # never a negative end
            self._given += ids[len(self._given) : stop]
            self._changed.notify_all()
        self._woken()

    def end(self) -> None:
        """No more text: every token is out."""
        with self._changed:
            if not self.ended:
                ids = self._tokens(self._text) if self._text else []
                self._given += ids[len(self._given) :]
                self.ended = True
                self._changed.notify_all()
        self._woken()

    def wait(self, known: int, timeout: float) -> None:
        """Until more than KNOWN ids are out, or the input ends, or TIMEOUT seconds."""
        with self._changed:
            if len(self._given) <= known and not self.ended:
                self._changed.wait(timeout)

    def _tokens(self, text: str) -> list[int]:
        try:
            return self._encode(text)
        except (TypeError, ValueError, UnicodeError) as exc:  # a lone surrogate, …
            raise InputError(f"the text cannot be tokenized ({str(exc)[:60]})",
                             hint="send UTF-8 text") from None  # fmt: skip

    def _woken(self) -> None:
        if self._wake is not None:
            self._wake.set()
