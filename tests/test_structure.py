"""The package's shape: no import cycle between its modules (imports inside functions too),
and no function or module too long to hold in one's head (docs/ARCHITECTURE.md, rules)."""

from __future__ import annotations

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "moss_gguf_cli"


def modules() -> dict[str, Path]:
    out = {}
    for path in PKG.rglob("*.py"):
        parts = list(path.relative_to(PKG.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def imports(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The package modules NAME imports, anywhere in its file."""
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                head = package[: len(package) - node.level + 1]
                base = ".".join(head + ([node.module] if node.module else []))
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base
                       for a in node.names]  # fmt: skip
        found |= {t for t in targets if t in known and t != name}
    return found


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        state[node] = 2
        path.pop()
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_no_import_cycle():
    known = modules()
    graph = {name: imports(name, path, known) for name, path in known.items()}
    assert graph["moss_gguf_cli.cli.app"] >= {"moss_gguf_cli.cli.all_cmd"}  # the walk sees edges
    assert find_cycle(graph) is None, " → ".join(find_cycle(graph) or [])


def test_only_the_cli_imports_the_server_and_it_imports_only_the_core_it_needs():
    """serve/ sits on top: only cli/ may import it; it uses tts/, errors, progress, holds."""
    known = modules()
    graph = {name: imports(name, path, known) for name, path in known.items()}
    serve = "moss_gguf_cli.serve"
    inside = {n for n in graph if n == serve or n.startswith(f"{serve}.")}
    assert "moss_gguf_cli.serve.scheduler" in inside  # the walk sees the package
    importers = {n for n, deps in graph.items() if deps & inside} - inside
    assert importers and all(n.startswith("moss_gguf_cli.cli.") for n in importers), importers
    allowed = ("moss_gguf_cli.tts", "moss_gguf_cli.errors", "moss_gguf_cli.progress",
               "moss_gguf_cli.holds", serve)  # fmt: skip
    used = set().union(*(graph[n] for n in inside)) - inside
    assert all(any(u == a or u.startswith(f"{a}.") for a in allowed) for u in used), used


def test_the_cycle_finder_finds_one():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


MAX_BODY_LINES = 80
MAX_MODULE_LINES = 800
LONG_MODULE_MARK = "# long module:"  # its first lines say why it is not split


def long_functions(source: str) -> list[tuple[str, int]]:
    """(name, body lines) of every function whose body is over MAX_BODY_LINES. The body is
    measured from its first statement: a Typer command's signature is its option list."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            lines = node.end_lineno - node.body[0].lineno + 1
            if lines > MAX_BODY_LINES:
                out.append((node.name, lines))
    return out


def too_long(source: str) -> bool:
    head = source.splitlines()[:12]
    return source.count("\n") > MAX_MODULE_LINES and not any(
        line.startswith(LONG_MODULE_MARK) for line in head
    )


def test_functions_and_modules_stay_short():
    found = {}
    for name, path in modules().items():
        source = path.read_text(encoding="utf-8")
        if too_long(source):
            found[name] = f"{source.count(chr(10))} lines"
        for func, lines in long_functions(source):
            found[f"{name}.{func}"] = f"body of {lines} lines"
    assert not found, found


def test_the_length_checks_find_long_code():
    long_body = "def f():\n" + "    x = 1\n" * (MAX_BODY_LINES + 1)
    assert long_functions(long_body) == [("f", MAX_BODY_LINES + 1)]
    assert long_functions("def f(\n" + "    a=1,\n" * 100 + "):\n    pass\n") == []
    assert too_long("x = 1\n" * (MAX_MODULE_LINES + 1))
    assert not too_long(f"{LONG_MODULE_MARK} one table\n" + "x = 1\n" * (MAX_MODULE_LINES + 1))
