"""VoiceStore: reference voices kept as their audio codes, one `NAME.npz` each.

A clip is encoded once (by the scheduler's worker) when it is registered; speaking with the
voice then reads the codes, so no request pays for the encoder again. Files are written to a
hidden temporary name and renamed into place, so a crash leaves no half voice; names are
checked against a strict pattern, so a name can never reach outside the folder.
"""

from __future__ import annotations

import io
import os
import re
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .api_errors import ApiError
from .settings import DEFAULT_VOICE, OPENAI_VOICES

NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}")
SUFFIX = ".npz"


@dataclass
class Voice:
    name: str
    frames: int
    text: str | None
    created: int
    codes: np.ndarray | None = None  # (T, n_vq), when loaded to speak

    def to_dict(self, frame_seconds: float) -> dict[str, Any]:
        return {
            "object": "voice",
            "name": self.name,
            "frames": self.frames,
            "seconds": round(self.frames * frame_seconds, 3),
            "text": self.text,
            "created": self.created,
        }


class VoiceStore:
    def __init__(self, folder: Path, n_vq: int, max_voices: int = 100):
        self.folder = Path(folder)
        self.n_vq = n_vq
        self.max_voices = max_voices
        self.folder.mkdir(parents=True, exist_ok=True)
        for stale in self.folder.glob(f".*{SUFFIX}.tmp*"):  # a crash mid-write left it
            stale.unlink(missing_ok=True)

    def check_name(self, name: str, param: str = "name") -> str:
        if not NAME.fullmatch(name or ""):
            raise ApiError(
                400,
                f"{param} {name!r} is not a valid voice name: use 1-64 letters, digits, '-' or "
                "'_', starting with a letter or digit",
                param=param,
                code="invalid_value",
            )
        if name == DEFAULT_VOICE or name in OPENAI_VOICES:
            raise ApiError(
                400,
                f"{param} {name!r} is a built-in voice name; choose another",
                param=param,
                code="invalid_value",
            )
        return name

    def path(self, name: str) -> Path:
        return self.folder / f"{name}{SUFFIX}"

    def check_new(self, name: str, replace: bool) -> None:
        """Refuse to register NAME when it would overwrite a voice unasked (409) or add one
        past the bound on the store (409): a page of another site must not be able to swap a
        voice's clip, nor fill the disk."""
        self.check_name(name)
        if self.path(name).exists():
            if not replace:
                raise ApiError(409, f"voice {name!r} exists; send the form field replace=true "
                               "to replace its clip and text, or choose another name",
                               param="name", code="voice_exists")  # fmt: skip
            return
        if self.count() >= self.max_voices:
            raise ApiError(409, f"the server stores at most {self.max_voices} voices "
                           "(--max-voices); delete one (DELETE /v1/audio/voices/NAME) first",
                           param="name", code="too_many_voices")  # fmt: skip

    def count(self) -> int:
        return sum(1 for _ in self.folder.glob(f"*{SUFFIX}"))

    def save(self, name: str, codes: np.ndarray, text: str | None, replace: bool = False) -> Voice:
        """Store NAME atomically; an existing NAME only with REPLACE (check_new's rules, held
        at the rename too, so two uploads of one name cannot both create it)."""
        self.check_new(name, replace)
        codes = np.asarray(codes, dtype=np.int16)  # codes are < 1025
        created = int(time.time())
        buffer = io.BytesIO()
        np.savez(buffer, codes=codes, text=np.array(text or ""), created=np.array(created))
        fd, tmp = tempfile.mkstemp(prefix=f".{name}{SUFFIX}.tmp", dir=self.folder)
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(buffer.getvalue())
                fh.flush()
                os.fsync(fh.fileno())
            if replace:
                os.replace(tmp, self.path(name))
            else:  # a link fails where the name exists: no check-then-write race
                os.link(tmp, self.path(name))
        except FileExistsError:
            raise ApiError(409, f"voice {name!r} was registered meanwhile; send "
                           "replace=true to replace it", param="name",
                           code="voice_exists") from None  # fmt: skip
        finally:
            Path(tmp).unlink(missing_ok=True)
        return Voice(name, int(codes.shape[0]), text or None, created)

    def load(self, name: str, param: str = "voice", codes: bool = True) -> Voice:
        """The stored voice NAME (404 naming PARAM when there is none)."""
        path = self.path(name)
        if not NAME.fullmatch(name or "") or not path.is_file():
            raise ApiError(
                404,
                f"{param} {name!r} is not a stored voice; GET /v1/audio/voices lists them, "
                "POST /v1/audio/voices adds one",
                param=param,
                code="voice_not_found",
            )
        try:
            with np.load(path, allow_pickle=False) as data:
                stored = np.asarray(data["codes"], dtype=np.int64)
                text, created = str(data["text"]), int(data["created"])
        except (OSError, ValueError, KeyError) as exc:
            raise ApiError(
                500, f"voice {name!r} cannot be read ({exc}); register it again",
                param=param, code="voice_unreadable",
            ) from exc  # fmt: skip
        if stored.ndim != 2 or stored.shape[1] != self.n_vq:
            raise ApiError(
                400,
                f"voice {name!r} holds codes of shape {stored.shape}, this model has "
                f"{self.n_vq} codebooks; register it again with this model",
                param=param,
                code="invalid_value",
            )
        return Voice(name, stored.shape[0], text or None, created, stored if codes else None)

    def list(self) -> list[Voice]:
        names = sorted(p.name[: -len(SUFFIX)] for p in self.folder.glob(f"*{SUFFIX}"))
        voices = []
        for name in names:
            try:
                voices.append(self.load(name, codes=False))
            except ApiError:
                continue  # not ours, or unreadable: listed voices must be usable
        return voices

    def delete(self, name: str) -> None:
        self.load(name, param="name", codes=False)
        self.path(name).unlink(missing_ok=True)
