"""The one catch point: exceptions become a one-line message and an exit code."""

from __future__ import annotations

import errno
import sys
import traceback
from typing import NoReturn

from rich.markup import escape

from ..errors import MossGgufError, is_debug, missing_package
from ._output import stderr


def _line(exc: BaseException) -> tuple[str, int]:
    if isinstance(exc, ImportError) and (missing := missing_package(exc)) is not None:
        exc = missing  # an extra or a dependency not installed: never "unexpected"
    if isinstance(exc, MossGgufError):
        return exc.one_line(), exc.exit_code
    if isinstance(exc, KeyboardInterrupt):
        return "interrupted; partial outputs were removed, rerun to resume", 130
    if isinstance(exc, OSError):
        where = f"{exc.filename}: " if exc.filename else ""
        if exc.errno == errno.ENOSPC:
            return f"{where}no space left on device (free some disk or choose another --output)", 1
        if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
            return f"{where}permission denied (choose a writable location)", 1
        return f"{where}{exc.strerror or exc}", 1
    if isinstance(exc, MemoryError):
        return "out of memory (close other programs or use a machine with more RAM)", 1
    return f"unexpected {type(exc).__name__}: {exc} (rerun with MOSS_GGUF_DEBUG=1 and report it)", 1


def fail(exc: BaseException) -> NoReturn:
    message, code = _line(exc)
    if is_debug():
        traceback.print_exception(exc)
    # escaped: a message may hold brackets (moss-gguf[serve]) that are not rich markup
    stderr.print(f"[bold red]error:[/] {escape(message)}", highlight=False, markup=True,
                 soft_wrap=True)  # fmt: skip
    sys.exit(code)
