"""The package's shape (docs/ARCHITECTURE.md §6, §8): no import cycle between its modules
(imports inside functions too), no import of another module's `_private` name, no room
importing a room above it, every room saying what it holds and may import, and no function or
module too long to hold in one's head."""

from __future__ import annotations

import ast
import re
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "moss_gguf_cli"


def modules(pkg: Path = PKG) -> dict[str, Path]:
    out = {}
    for path in pkg.rglob("*.py"):
        parts = list(path.relative_to(pkg.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def import_edges(name: str, path: Path, known: dict[str, Path]) -> list[tuple[str, str]]:
    """(module, name or "") for every import of a package module in NAME's file, anywhere in it:
    `from M import x` gives (M, "x") unless M.x is a module itself (then (M.x, ""))."""
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found += [(a.name, "") for a in node.names if a.name in known]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                head = package[: len(package) - node.level + 1]
                base = ".".join(head + ([node.module] if node.module else []))
            for a in node.names:
                if f"{base}.{a.name}" in known:
                    found.append((f"{base}.{a.name}", ""))
                elif base in known:
                    found.append((base, a.name))
    return [(m, n) for m, n in found if m != name]


def imports(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The package modules NAME imports, anywhere in its file."""
    return {module for module, _ in import_edges(name, path, known)}


def private_imports(name: str, path: Path, known: dict[str, Path]) -> list[str]:
    """NAME's imports of another module's `_private` name, or of a `_private` module outside
    the package that holds it."""
    bad = []
    own = name.rsplit(".", 1)[0] if path.name != "__init__.py" else name
    for module, imported in import_edges(name, path, known):
        if imported.startswith("_") and not imported.startswith("__"):
            bad.append(f"{module}.{imported}")
        leaf = module.rsplit(".", 1)
        if not imported and leaf[-1].startswith("_") and leaf[0] != own and leaf[-1] != "__main__":
            bad.append(module)
    return bad


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
    """serve/ is a stage core, family-blind: only cli/, the family registry (lazily, each
    family's serve entry) and the family rooms (their steppers and loaders) may import it; it
    uses tts/ (shared speech), errors, progress, hold_points, and no family's room."""
    known = modules()
    graph = {name: imports(name, path, known) for name, path in known.items()}
    serve = "moss_gguf_cli.serve"
    inside = {n for n in graph if n == serve or n.startswith(f"{serve}.")}
    assert "moss_gguf_cli.serve.scheduler" in inside  # the walk sees the package
    importers = {n for n, deps in graph.items() if deps & inside} - inside
    rooms = ("moss_gguf_cli.cli.", "moss_gguf_cli.families.", "moss_gguf_cli.delay.",
             "moss_gguf_cli.nano.", "moss_gguf_cli.realtime.")  # fmt: skip
    assert importers and all(n.startswith(rooms) for n in importers), importers
    allowed = ("moss_gguf_cli.tts", "moss_gguf_cli.errors", "moss_gguf_cli.progress",
               "moss_gguf_cli.hold_points", serve)  # fmt: skip
    used = set().union(*(graph[n] for n in inside)) - inside
    assert all(any(u == a or u.startswith(f"{a}.") for a in allowed) for u in used), used


def test_no_private_name_crosses_a_module():
    known = modules()
    found = {n: bad for n, p in known.items() if (bad := private_imports(n, p, known))}
    assert not found, found


# The rooms, bottom to top (docs/ARCHITECTURE.md §6). A room imports only rooms of a lower
# rank: never one above, never one beside it, so the graph of rooms is acyclic by construction.
# The package's top-level modules (errors, progress, report, hold_points) are rank 0.
RANKS = {
    "disk": 1, "native": 1,
    "gguf": 2,
    "source": 3,
    "graphs": 3,  # the ggml graph layer: over native/ alone, so every room that speaks may use it
    "tts": 4, "quantize": 4,
    "verify": 5, "doctor": 5,  # rows and checks a family uses
    "pipeline": 6, "serve": 6,  # the stage cores, family-blind
    # a model family's room each: over the stage cores it fills, under the registry
    "nano": 7, "delay": 7, "realtime": 7,
    "families": 8,  # the registry: which family an input, folder or config is; its entries
    "cli": 9,
    "__main__": 10,  # python -m moss_gguf_cli: the entry point over the CLI
}  # fmt: skip
LAZY_MARK = "# lazy:"  # an import of another room inside a function says why, on the line above


def room(module: str) -> str:
    """The room a module lives in ("" for the package's top-level modules)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in RANKS else ""


def rank(module: str) -> int:
    return RANKS.get(room(module), 0)


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    """Imports of a room above, or of another room on the same rank."""
    return sorted(
        f"{a} → {b}"
        for a, deps in graph.items()
        for b in deps
        if rank(b) > rank(a) or (rank(b) == rank(a) and room(b) != room(a))
    )


def room_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    rooms: dict[str, set[str]] = {}
    for a, deps in graph.items():
        rooms.setdefault(room(a), set()).update(room(b) for b in deps if room(b) != room(a))
    for deps in list(rooms.values()):
        for b in deps:
            rooms.setdefault(b, set())
    return rooms


def unexplained_lazy_imports(name: str, path: Path, known: dict[str, Path]) -> list[str]:
    """Imports of another room inside a function whose line above is not a `# lazy:` comment."""
    lines = path.read_text(encoding="utf-8").splitlines()
    tree = ast.parse("\n".join(lines))
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    found = []
    for fn in ast.walk(tree):
        if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        for node in ast.walk(fn):
            if not isinstance(node, ast.ImportFrom) or not node.level:
                continue
            head = package[: len(package) - node.level + 1]
            target = ".".join(head + ([node.module] if node.module else []))
            before = lines[node.lineno - 2].strip() if node.lineno > 1 else ""
            if room(target) != room(name) and LAZY_MARK not in before:
                found.append(f"{name}:{node.lineno} imports {target}")
    return found


def test_rooms_import_only_downward():
    known = modules()
    graph = {name: imports(name, path, known) for name, path in known.items()}
    rooms = {n.split(".")[1] for n in known if n.count(".") >= 1 and known[n].name == "__init__.py"}
    assert rooms <= set(RANKS), f"rank the new room(s) {rooms - set(RANKS)}"
    assert upward_imports(graph) == []


def test_the_room_graph_is_acyclic():
    """Over every file of each room, imports inside functions included."""
    known = modules()
    graph = room_graph({name: imports(name, path, known) for name, path in known.items()})
    assert graph["pipeline"] >= {"quantize", "source", "gguf"}  # the walk sees the rooms
    assert find_cycle(graph) is None, " → ".join(find_cycle(graph) or [])


def test_imports_between_rooms_are_at_the_top_unless_they_say_why():
    known = modules()
    found = [bad for n, p in known.items() for bad in unexplained_lazy_imports(n, p, known)]
    assert found == []


# The family rooms and the registry, and the delay family's checkpoint reader
# (source/checkpoint.py), which refuses the others' checkpoints by name
FAMILY_CODE = ("nano/", "delay/", "realtime/", "families/", "source/checkpoint.py")
NAMES_A_FAMILY = re.compile(r"^\s*(if|elif)\b.*(nano|realtime|\bdelay)", re.IGNORECASE)


def family_branches(root: Path) -> list[str]:
    """The if/elif lines outside a family's code that name a family (comments included): the
    stages ask the registry (families/) instead."""
    found = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if rel.startswith(FAMILY_CODE):
            continue
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if NAMES_A_FAMILY.match(line):
                found.append(f"{rel}:{number}: {line.strip()}")
    return found


def test_the_stages_never_branch_on_a_family(tmp_path):
    assert family_branches(PKG) == []
    planted = tmp_path / "cli" / "synth_cmd.py"
    planted.parent.mkdir()
    planted.write_text("def f(config):\n    if is_nano_config(config):\n        return 1\n")
    assert family_branches(tmp_path) == ["cli/synth_cmd.py:2: if is_nano_config(config):"]


def test_every_room_says_what_it_holds_and_may_import():
    silent = [
        str(path.relative_to(PKG.parent))
        for path in PKG.glob("*/__init__.py")
        if "May import" not in (ast.get_docstring(ast.parse(path.read_text())) or "")
    ]
    assert silent == []
    top = sorted(p.stem for p in PKG.glob("*.py") if p.stem not in ("__init__", "__main__"))
    assert len(top) <= 8, top


def test_the_room_checks_find_planted_violations(tmp_path):
    pkg = tmp_path / "moss_gguf_cli"
    files = {
        "__init__.py": "",
        "errors.py": "from .disk.sinks import Sink\n",  # rank 0 importing rank 1
        "disk/__init__.py": "",
        "disk/sinks.py": "class Sink: ...\n_buffer = 1\n",
        "gguf/__init__.py": "",
        "gguf/write.py": "from ..disk.sinks import Sink, _buffer\n",  # a private name
        "gguf/read.py": "def f():\n    from ..pipeline import run\n",  # upward, in a function
        "tts/__init__.py": "",
        "tts/codec.py": "",
        "quantize/__init__.py": "",
        "quantize/llama.py": "from ..tts import codec\n",  # beside it, on the same rank
        "source/__init__.py": "",
        "source/hub.py": "def f():\n    # lazy: a reason\n    from ..gguf import write\n\n\n"
        "def g():\n    from ..gguf import read\n",  # said why; did not
        "pipeline/__init__.py": "",
        "pipeline/run.py": "from ..cli import _output\n",  # upward, and a private module
        "cli/__init__.py": "",
        "cli/_output.py": "",
        "cli/app.py": "from . import _output\n",  # its own package's private module: fine
    }
    for rel, text in files.items():
        (pkg / rel).parent.mkdir(parents=True, exist_ok=True)
        (pkg / rel).write_text(text)
    known = modules(pkg)
    graph = {name: imports(name, path, known) for name, path in known.items()}
    assert upward_imports(graph) == [
        "moss_gguf_cli.errors → moss_gguf_cli.disk.sinks",
        "moss_gguf_cli.gguf.read → moss_gguf_cli.pipeline.run",
        "moss_gguf_cli.pipeline.run → moss_gguf_cli.cli._output",
        "moss_gguf_cli.quantize.llama → moss_gguf_cli.tts.codec",
    ]
    lazy = sorted(b for n, p in known.items() for b in unexplained_lazy_imports(n, p, known))
    assert lazy == ["moss_gguf_cli.gguf.read:2 imports moss_gguf_cli.pipeline",
                    "moss_gguf_cli.source.hub:7 imports moss_gguf_cli.gguf"]  # fmt: skip
    assert find_cycle(room_graph(graph)) is None
    # gguf → source → gguf: two modules each importing downward in its own eyes
    both = {"moss_gguf_cli.gguf.read": {"moss_gguf_cli.source.hub"},
            "moss_gguf_cli.source.hub": {"moss_gguf_cli.gguf.write"}}  # fmt: skip
    assert find_cycle(room_graph(both)) == ["gguf", "source", "gguf"]
    private = {n: bad for n, p in known.items() if (bad := private_imports(n, p, known))}
    assert private == {
        "moss_gguf_cli.gguf.write": ["moss_gguf_cli.disk.sinks._buffer"],
        "moss_gguf_cli.pipeline.run": ["moss_gguf_cli.cli._output"],
    }


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


def native_uses(tree: ast.AST) -> set[str]:
    """What only native/libllama.py may do: import llama-cpp-python, set llama.cpp's
    process-wide log callback, or reach into its private library handle."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import) and any(a.name.split(".")[0] == "llama_cpp"
                                                for a in node.names):  # fmt: skip
            found.add("import llama_cpp")
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("llama_cpp"):
            found.add("import llama_cpp")
        elif isinstance(node, ast.Attribute) and node.attr in ("llama_log_set", "_lib"):
            found.add(node.attr)
    return found


def test_libllama_is_loaded_and_its_log_hooked_in_one_place():
    found = {
        name: uses
        for name, path in modules().items()
        if (uses := native_uses(ast.parse(path.read_text(encoding="utf-8"))))
    }
    assert found == {"moss_gguf_cli.native.libllama": {"import llama_cpp", "llama_log_set"}}
    planted = "import ctypes\ndef f(llama_cpp):\n    llama_cpp.llama_log_set(None, None)\n"
    assert native_uses(ast.parse(planted)) == {"llama_log_set"}
    assert native_uses(ast.parse("from llama_cpp import _logger\n")) == {"import llama_cpp"}


FAMILY_ROOMS = ("delay", "nano", "realtime")  # a model family's room each (rank 7)


def family_room_importers(graph: dict[str, set[str]]) -> list[str]:
    """Imports of a family's room from outside it by anything but the registry (families/):
    the stages and the CLI reach a family through the registry alone."""
    return sorted(
        f"{a} → {b}"
        for a, deps in graph.items()
        for b in deps
        if room(b) in FAMILY_ROOMS and room(a) not in (room(b), "families")
    )


def test_only_the_registry_imports_a_family_room():
    known = modules()
    graph = {name: imports(name, path, known) for name, path in known.items()}
    assert {room(m) for m in known} >= set(FAMILY_ROOMS)  # the rooms are there
    assert all(RANKS[r] == RANKS["nano"] for r in FAMILY_ROOMS)
    assert family_room_importers(graph) == []
    planted = {**graph, "moss_gguf_cli.cli.synth_cmd": {"moss_gguf_cli.nano.synth"}}
    assert family_room_importers(planted) == [
        "moss_gguf_cli.cli.synth_cmd → moss_gguf_cli.nano.synth"]
