"""The run's build cache: every folder the tests speak with, convert or verify is built once per
run, by the command a user would run, and shared by the tests (and the xdist workers) that read
it.

A folder is keyed by what makes it: the command line (or a named maker) and the environment it
runs in. The first test to ask builds it under a file lock; later ones, in any worker, get the
same folder. Each folder's digest is taken when it is built and compared at the end of the
session (the `builds` fixture), since permissions alone do not stop root: a test that needs to
change a folder asks `copy` for its own.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from filelock import FileLock


@dataclass(frozen=True)
class Built:
    """A finished build: its folder (or file), and what its command printed."""

    path: Path
    stdout: str = ""
    stderr: str = ""


def digest(path: Path) -> str:
    """sha256 over every file below PATH (names, modes, bytes; links as their targets)."""
    h = hashlib.sha256()
    items = sorted(path.rglob("*")) if path.is_dir() else [path]
    for item in items:
        rel = item.relative_to(path).as_posix() if path.is_dir() else item.name
        if item.is_symlink():
            h.update(f"L {rel} {os.readlink(item)}\n".encode())
        elif item.is_file():
            h.update(f"F {rel} {item.stat().st_mode:o} {item.stat().st_size}\n".encode())
            with open(item, "rb") as f:
                while chunk := f.read(1 << 20):
                    h.update(chunk)
        elif item.is_dir():
            h.update(f"D {rel}\n".encode())
    return h.hexdigest()


class Builds:
    def __init__(self, root: Path):
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        self._used: dict[Path, str] = {}  # the folders this process handed out → digest then

    def _slot(self, key: object, label: str) -> Path:
        text = json.dumps(key, sort_keys=True, default=str)
        name = "".join(c if c.isalnum() or c in "-_" else "-" for c in label)[:40]
        return self.root / f"{name}-{hashlib.sha1(text.encode()).hexdigest()[:12]}"

    def make(self, name: str, maker: Callable[[Path], object], *key: object,
             leaf: str = "out") -> Built:  # fmt: skip
        """DEST, made by MAKER(DEST) once per run for (NAME, KEY): DEST (named LEAF, in a folder
        of its own) does not exist before; MAKER writes it, a folder or a file. When MAKER
        returns a Built, its stdout and stderr are kept."""
        slot = self._slot([name, *key, leaf], name)
        record = slot / "built.json"
        with FileLock(str(slot) + ".lock"):
            if not record.is_file():
                if slot.exists():
                    shutil.rmtree(slot)  # an interrupted build of an earlier attempt
                (slot / "out").mkdir(parents=True)
                out = slot / "out" / leaf
                made = maker(out)
                stdout, stderr = (made.stdout, made.stderr) if isinstance(made, Built) else ("", "")
                facts = {"path": str(out), "stdout": stdout, "stderr": stderr,
                         "digest": digest(out)}  # fmt: skip
                record.write_text(json.dumps(facts))
        facts = json.loads(record.read_text())
        path = Path(facts["path"])
        self._used[path] = facts["digest"]
        return Built(path, facts["stdout"], facts["stderr"])

    def cli(self, *args: str, output: str = "--output", name: str = "w",
            env: dict[str, str] | None = None) -> Built:  # fmt: skip
        """`moss-gguf ARGS OUTPUT <folder>/NAME` as a user runs it (a subprocess), once per run;
        it must succeed. ENV is added to the environment (and is part of the key)."""

        def run(out: Path) -> Built:
            cmd = [sys.executable, "-m", "moss_gguf_cli", *args, output, str(out)]
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=900,
                                  env={**os.environ, "COLUMNS": "160", **(env or {})})  # fmt: skip
            assert done.returncode == 0, f"{' '.join(args)}: {done.stderr[-3000:]}"
            return Built(out, done.stdout, done.stderr)

        label = "-".join(a for a in args if not a.startswith("/"))
        return self.make(label, run, *args, output, env or {}, leaf=name)

    def all(self, *args: str, env: dict[str, str] | None = None) -> Built:
        """`moss-gguf all ARGS --output <folder>`, once per run."""
        return self.cli("all", *args, env=env)

    @staticmethod
    def copy(path: Path, dest: Path) -> Path:
        """DEST: a copy of a shared build a test may change. Files are hard links (replace a
        file, never write into it); links stay links."""
        if path.is_dir():
            shutil.copytree(path, dest, symlinks=True, copy_function=os.link)
        else:
            os.link(path, dest)
        return dest

    def changed(self) -> list[str]:
        """The folders handed out whose contents are no longer what was built."""
        return [str(p) for p, d in self._used.items() if digest(p) != d]
