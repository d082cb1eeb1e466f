"""`all`'s last step, verify, failing: what the run wrote is removed, and the error says so.

A folder that fails verify must not stay at OUTPUT looking finished. One rule for every `all`
route (delay steps, pre-converted, first-class GGUF, MOSS-TTS-Nano): the folder is removed when
this run wrote it, or resumed the unfinished run that wrote it (the delay family's work folder
is still there: that run never got past its verify), and the run's work folder with it, so a
rerun starts over instead of resuming from what made a failing folder. A folder a finished
earlier run left (it passed that run's verify), which this run only verified again, is left as
it was: this run did not write it, and a failure now is a change made since (an edited file,
a stricter verify); the error says so, and how to see the report and redo it.
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from ..disk.staging import discard
from ..errors import MossGgufError
from ..report import FAIL, CheckRow

log = logging.getLogger(__name__)

_AS_IS_HINT = "`moss-gguf verify` shows the full report; --force redoes all"


class VerifyFailed(MossGgufError):
    """verify's failing rows on a folder `all` made (exit 1): the first with its detail, the
    others by name, the count, and what became of the folder."""

    def __init__(self, folder: Path, failed: Sequence[CheckRow], fate: str = "",
                 hint: str = _AS_IS_HINT) -> None:  # fmt: skip
        self.folder, self.failed = Path(folder), list(failed)
        first, n = self.failed[0], len(self.failed)
        others = "; also " + ", ".join(r.name for r in self.failed[1:]) if n > 1 else ""
        checks = "check" if n == 1 else "checks"
        super().__init__(f"verify failed: {first.name}: {first.detail}{others} "
                         f"({n} failing {checks}){fate}", path=folder, hint=hint)  # fmt: skip

    def removed(self) -> VerifyFailed:
        """The error once the folder is gone: `moss-gguf verify` has nothing left to read."""
        return VerifyFailed(self.folder, self.failed, "; the folder was removed",
                            hint="rerun with -v to see every check's row; the rerun starts "
                            "over")  # fmt: skip

    def kept(self) -> VerifyFailed:
        """The error on a finished earlier run's folder, left as it was."""
        return VerifyFailed(self.folder, self.failed,
                            "; left as it was: a finished earlier run made it",
                            hint=f"`moss-gguf verify {self.folder}` shows the full report; "
                            "--force makes it again")  # fmt: skip


def require_pass(folder: Path, rows: Sequence[CheckRow], expected: frozenset[str] = frozenset()
                 ) -> None:  # fmt: skip
    """Raise VerifyFailed when a row fails (but those named in EXPECTED, failing by design);
    every row is logged first (-v shows them: the folder may be removed before anyone looks)."""
    failed = [r for r in rows if r.status == FAIL and r.name not in expected]
    if not failed:
        return
    for row in rows:
        log.debug("verify %s: %s: %s", row.status, row.name, row.detail)
    raise VerifyFailed(folder, failed)


@dataclass(frozen=True)
class Written:
    """A run's output and whose it is, for `removed_if_verify_fails`."""

    folder: Path
    work: tuple[Path, ...] = ()  # the run's own work folders beside it
    ours: bool = True  # False: a finished earlier run's folder, only verified by this run


@contextmanager
def removed_if_verify_fails(written: Written) -> Iterator[None]:
    """Around a run's verify: on VerifyFailed, remove what the run wrote (see the module's
    docstring for the rule) and raise the error that says what became of the folder. Any
    other error leaves everything as it is (an interrupted run resumes from its work)."""
    try:
        yield
    except VerifyFailed as exc:
        if not written.ours:
            raise exc.kept() from exc
        discard(written.folder)  # renamed first: a kill mid-delete leaves nothing at OUTPUT
        for work in written.work:
            shutil.rmtree(work, ignore_errors=True)
        raise exc.removed() from exc
