"""The suite reads most refusals in process (tests/in_process.py); here a child process, the
console entry point a user runs, renders each of them the same: exit code, stdout, stderr, one
line, no traceback."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from in_process import moss_gguf

from moss_gguf_cli import __version__

# (arguments with {t} for a fresh folder, exit code); each is refused before any work
REFUSALS = [
    (["extract", "--model", "{t}/nope", "--output", "{t}/o"], 2),
    (["extract", "--model", "builtin:huge", "--output", "{t}/o"], 2),
    (["all", "--model", "builtin:tiny", "--output", "{t}/w", "--engine", "bogus"], 2),
    (["all", "--model", "builtin:tiny", "--output", "{t}/w", "--base-model", "not a repo"], 2),
    (["convert", "builtin:tiny", "-o", "{t}/x.gguf", "--format", "gguf2"], 2),
    (["quantize", "{t}/missing.gguf", "Q4_K_M"], 2),
    (["verify", "{t}/nothing-here"], 2),
    (["synth", "--config", "{t}/missing.yaml", "--text", "Hello"], 2),
    (["serve", "--config", "{t}/missing.yaml"], 2),
    (["layout", "--extracted", "{t}/nope", "--output", "{t}/o"], 2),
]


def child(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "moss_gguf_cli", *args], capture_output=True,
                          text=True, timeout=120, env={**os.environ, "COLUMNS": "80"})  # fmt: skip


@pytest.mark.parametrize(("template", "code"), REFUSALS, ids=[r[0][0] + "-" + str(i)
                                                               for i, r in enumerate(REFUSALS)])
def test_a_child_process_renders_a_refusal_as_the_suite_reads_it(template, code, tmp_path: Path):
    args = [a.format(t=tmp_path) for a in template]
    inside = moss_gguf(*args)
    outside = child(*args)
    assert (outside.returncode, outside.stdout, outside.stderr) == (
        inside.returncode, inside.stdout, inside.stderr)  # fmt: skip
    assert outside.returncode == code, outside.stderr
    lines = outside.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), outside.stderr
    assert "Traceback" not in outside.stderr and outside.stdout == ""
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # nothing written


def test_the_version_goes_to_stdout_both_ways() -> None:
    inside, outside = moss_gguf("--version"), child("--version")
    version = f"moss-gguf {__version__}\n"
    assert (inside.returncode, inside.stdout, inside.stderr) == (0, version, "")
    assert (outside.returncode, outside.stdout, outside.stderr) == (0, inside.stdout, "")
