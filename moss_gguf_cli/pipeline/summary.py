"""What `all` made, said in a form any family's folder fits: the CLI renders it without
knowing the family (the delay family's richer result, pipeline/route.AllOutcome, has its own
renderer until its convert moves into its room)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class FolderSummary:
    """A finished, verified folder: its parts' sizes, then lines such as verify's counts and
    how to speak it. `--quiet` prints the folder's path alone (scripts read it)."""

    output: Path
    title: str  # the parts table's title: the folder and the family
    parts: list[tuple[str, int]]  # a part (a file, or a folder ending in "/") and its bytes
    lines: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def part_sizes(files: list[tuple[str, int]], parts: list[str]) -> list[tuple[str, int]]:
    """Each of PARTS with the bytes of FILES (relative path, bytes) it is or holds."""
    return [(name, sum(s for p, s in files if p == name or p.startswith(name)))
            for name in parts]  # fmt: skip


def verified_folder(output: Path, title: str, parts: list[tuple[str, int]],
                    counts: dict[str, int], config: Path,
                    notes: list[str]) -> FolderSummary:  # fmt: skip
    """A family folder `all` made and verify passed: its parts, verify's counts, and the
    command that speaks it (CONFIG: its synth config)."""
    return FolderSummary(
        output, f"{output} ({title})", parts,
        [f"verify: {counts['pass']} passed, {counts['warn']} warnings, {counts['fail']} failed",
         f"speak it: moss-gguf synth --config {config} --text 'Hello' -o hello.wav"],
        notes)  # fmt: skip
