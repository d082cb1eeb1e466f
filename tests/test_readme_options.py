"""The documentation keeps its promises. Every option the README (either language) or a page
under docs/ shows a command with is a real option of that command, and some test runs that
command with it: the docs cannot promise what no test has seen work. Every relative link
resolves; the README stays a front page (its size, the set-up commands near the top); the
Chinese README keeps step with the English one."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import typer.main

from moss_gguf_cli.cli.app import app

ROOT = Path(__file__).resolve().parents[1]
READMES = ("README.md", "README_zh.md")
FRONT_PAGE_BYTES = 12_000
SETUP_WITHIN_LINES = 40


def doc_pages() -> list[Path]:
    """The READMEs and every Markdown page under docs/ (new pages are picked up by themselves)."""
    return [ROOT / f for f in READMES] + sorted((ROOT / "docs").rglob("*.md"))
SUBCOMMANDS = {"extract", "convert", "quantize", "all", "layout", "verify", "synth", "serve",
               "doctor", "push"}


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


def test_doc_options_are_real_and_tested():
    shown = {(page.relative_to(ROOT).as_posix(), s, o) for page in doc_pages()
             for s, o in readme_options(page.read_text(encoding="utf-8"))}  # fmt: skip
    pairs = {(s, o) for _, s, o in shown}
    assert ("all", "--model") in pairs and ("synth", "--config") in pairs  # the scan sees them
    assert any(p.startswith("docs/commands/") for p, _, _ in shown)  # … and the pages
    known = command_options()
    unknown = sorted(x for x in shown if x[2] not in known[x[1]])
    assert not unknown, f"options the commands do not have (page, command, option): {unknown}"
    tested = options_in_tests(sorted((ROOT / "tests").glob("test_*.py")))
    untested = sorted(x for x in shown if x[1:] not in tested)
    assert not untested, f"options no test runs (page, command, option): {untested}"


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


# Links, headings and the front page.

FENCE = re.compile(r"^(```|~~~).*?^\1[^\n]*$", re.S | re.M)
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")


def prose(text: str) -> str:
    """The text outside fenced code blocks and inline code spans (where `[x](y)` is no link)."""
    return re.sub(r"`[^`\n]+`", "", FENCE.sub("", text))


def headings(text: str) -> list[tuple[int, str]]:
    """(level, title) of each ATX heading outside fenced code (a `# comment` in bash is none)."""
    found = []
    for line in FENCE.sub("", text).splitlines():
        if m := re.match(r"(#{1,6})\s+(.*?)\s*#*\s*$", line):
            found.append((len(m[1]), m[2]))
    return found


def anchors(text: str) -> set[str]:
    """GitHub's ids for the headings: lower case, punctuation dropped, spaces to hyphens,
    a repeated id numbered -1, -2, …"""
    seen: dict[str, int] = {}
    for _, title in headings(text):
        slug = re.sub(r"[^\w\- ]", "", title.lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        if n:
            seen[f"{slug}-{n}"] = 1
    return set(seen)


def relative_links(text: str) -> list[str]:
    return [t for t in LINK.findall(prose(text)) if not re.match(r"[a-z][a-z+.-]*:", t)]


def broken_links(page: Path, root: Path = ROOT) -> list[str]:
    """Each relative link of a page whose file does not exist (inside root), or whose #anchor
    is no heading of the Markdown file it names."""
    broken = []
    for target in relative_links(page.read_text(encoding="utf-8")):
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists() or root not in (dest, *dest.parents):
            broken.append(target)
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest.read_text("utf-8")):
            broken.append(target)
    return broken


def test_every_relative_link_resolves():
    linked = {p.relative_to(ROOT).as_posix(): relative_links(p.read_text("utf-8"))
              for p in doc_pages()}  # fmt: skip
    assert "docs/commands/serve.md" in linked["README.md"]  # the scan sees the README's links
    broken = {p.relative_to(ROOT).as_posix(): b for p in doc_pages() if (b := broken_links(p))}
    assert not broken, f"links that lead nowhere, by page: {broken}"


def test_every_docs_page_is_reachable_from_the_readme():
    """A page nobody links is a page nobody reads: each page under docs/ is linked from the
    README or from a page the README leads to."""
    seen, todo = set(), [ROOT / "README.md"]
    while todo:
        page = todo.pop()
        if page in seen or page.suffix != ".md" or not page.exists():
            continue
        seen.add(page)
        for target in relative_links(page.read_text("utf-8")):
            if path := target.partition("#")[0]:
                todo.append((page.parent / path).resolve())
    lost = sorted(p.relative_to(ROOT).as_posix() for p in doc_pages() if p not in seen)
    assert not lost, f"pages no link leads to from README.md: {lost}"


def setup_commands() -> list[str]:
    """The commands .ci/run runs, each the line after a `# README command N` comment."""
    lines = (ROOT / ".ci" / "run").read_text().splitlines()
    return [lines[i + 1].strip() for i, line in enumerate(lines)
            if line.startswith("# README command")]  # fmt: skip


def test_readme_is_a_front_page():
    size = (ROOT / "README.md").stat().st_size
    assert size <= FRONT_PAGE_BYTES, f"README.md is {size} bytes: move detail to a docs/ page"
    commands = setup_commands()
    assert len(commands) == 2 and commands[1].endswith("ruff check . && python -m pytest -q")
    for name in READMES:
        top = "\n".join((ROOT / name).read_text("utf-8").splitlines()[:SETUP_WITHIN_LINES])
        missing = [c for c in commands if c not in top]
        assert not missing, f"{name}: not in its first {SETUP_WITHIN_LINES} lines: {missing}"


def test_readme_zh_keeps_step_with_readme():
    """The same headings level by level, the same code blocks, the same pages linked."""
    en, zh = ((ROOT / f).read_text("utf-8") for f in READMES)
    assert [lv for lv, _ in headings(zh)] == [lv for lv, _ in headings(en)]
    blocks = [m[0] for m in FENCE.finditer(en)]
    assert blocks and [m[0] for m in FENCE.finditer(zh)] == blocks

    def pages(text: str) -> list[str]:
        return [t for t in relative_links(text) if not t.startswith(("#", "README"))]

    assert pages(zh) == pages(en)


def test_the_link_checks_see_what_they_should(tmp_path):
    page = tmp_path / "docs" / "a.md"
    page.parent.mkdir()
    (tmp_path / "docs" / "b.md").write_text("# The `all` command — twice\n## Q&A\n## Q&A\n")
    page.write_text(
        "# A\n```bash\n# not a heading [x](nowhere.md)\n```\n"
        "[ok](b.md#the-all-command--twice) [ok](b.md#qa-1) [ok](#a) [web](https://x.org/y)\n"
        "`[code](gone.md)` [gone](c.md) [bad anchor](b.md#nope) [bad](#b)\n"
    )
    assert headings(page.read_text()) == [(1, "A")]
    assert anchors((tmp_path / "docs" / "b.md").read_text()) == {
        "the-all-command--twice", "qa", "qa-1"}
    assert broken_links(page, tmp_path) == ["c.md", "b.md#nope", "#b"]


def test_docs_name_the_pinned_llama_cpp_python():
    """The troubleshooting page's reinstall line is copied by hand: it names the pin."""
    from moss_gguf_cli.native import pins

    pinned = re.compile(r"llama-cpp-python==([\w.]+)")
    named = {v for page in doc_pages() for v in pinned.findall(page.read_text("utf-8"))}
    assert named == {pins.LLAMA_CPP_PYTHON}
