"""Every option the README (either language) shows a command with is a real option of that
command, and some test runs that command with it: the README cannot promise what no test
has seen work."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import typer.main

from moss_gguf_cli.cli.app import app

ROOT = Path(__file__).resolve().parents[1]
READMES = ("README.md", "README_zh.md")
SUBCOMMANDS = {"extract", "convert", "quantize", "all", "layout", "verify", "synth", "serve",
               "doctor"}


def readme_options(text: str) -> set[tuple[str, str]]:
    """(subcommand, --option) for each `moss-gguf SUB …` line in code, blocks or inline."""
    found = set()
    spans = re.findall(r"```[a-z]*\n(.*?)```", text, re.S) + re.findall(r"`([^`\n]+)`", text)
    for span in spans:
        for line in span.replace("\\\n", " ").splitlines():
            for sub, rest in re.findall(r"moss-gguf\s+([a-z]+)((?:\s+[^|;`]*)?)", line):
                if sub in SUBCOMMANDS:
                    found |= {(sub, o) for o in re.findall(r"(?<![\w-])(--[a-z][\w-]*)", rest)}
    return found


def command_options() -> dict[str, set[str]]:
    group = typer.main.get_command(app)
    return {
        name: {o for p in cmd.params for o in (*p.opts, *p.secondary_opts)}
        for name, cmd in group.commands.items()
    }


def _strings(node: ast.AST) -> set[str]:
    return {n.value for n in ast.walk(node) if isinstance(n, ast.Constant)
            and isinstance(n.value, str)}  # fmt: skip


def _name(func: ast.expr) -> str | None:
    return func.id if isinstance(func, ast.Name) else getattr(func, "attr", None)


def options_in_tests(files: list[Path]) -> set[tuple[str, str]]:
    """(subcommand, option) pairs some test passes together: in one argument list or call,
    or in a call of a test helper that runs exactly one subcommand."""
    covered: set[tuple[str, str]] = set()
    for path in files:
        tree = ast.parse(path.read_text(encoding="utf-8"))
        wrappers = {}
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef) and not node.name.startswith("test_"):
                subs = _strings(node) & SUBCOMMANDS
                if len(subs) == 1:
                    wrappers[node.name] = subs.pop()
        for node in ast.walk(tree):
            if not isinstance(node, ast.List | ast.Tuple | ast.Call):
                continue
            words = _strings(node)
            subs = words & SUBCOMMANDS
            if isinstance(node, ast.Call) and _name(node.func) in wrappers:
                subs.add(wrappers[_name(node.func)])
            opts = {w.split("=")[0] for w in words if w.startswith("--")}
            covered |= {(s, o) for s in subs for o in opts}
    return covered


def test_readme_options_are_real_and_tested():
    shown = set().union(*(readme_options((ROOT / f).read_text(encoding="utf-8"))
                          for f in READMES))  # fmt: skip
    assert ("all", "--model") in shown and ("synth", "--config") in shown  # the scan sees them
    known = command_options()
    unknown = sorted((s, o) for s, o in shown if o not in known[s])
    assert not unknown, f"README options the commands do not have: {unknown}"
    untested = sorted(shown - options_in_tests(sorted((ROOT / "tests").glob("test_*.py"))))
    assert not untested, f"README options no test runs: {untested}"


def test_the_scans_see_what_they_should(tmp_path):
    text = "```bash\nmoss-gguf all --model x \\\n    --quant Q8_0\n```\n"
    text += "or `moss-gguf doctor --json`"
    assert readme_options(text) == {("all", "--model"), ("all", "--quant"), ("doctor", "--json")}
    test = tmp_path / "test_x.py"
    test.write_text(
        "def run_all(*a):\n    return ['all', *a]\n\n"
        "def test_a():\n    run_all('--quant', 'Q8_0')\n    cli(['verify', 'x', '--deep'])\n"
    )
    assert options_in_tests([test]) == {("all", "--quant"), ("verify", "--deep")}
