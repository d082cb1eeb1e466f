"""native/libllama.py's one log hook: a hook routed over another gives llama.cpp's log back to
it when undone (a quantize in a process that speaks leaves the backbone's hook in place)."""

from __future__ import annotations

from moss_gguf_cli.native import libllama


def load_nothing(path: str) -> None:
    """A model load that fails: llama.cpp logs why through the hook in place."""
    llama_cpp = libllama.bindings()
    params = llama_cpp.llama_model_default_params()
    assert not llama_cpp.llama_model_load_from_file(path.encode(), params)


def test_undoing_a_hook_restores_the_one_routed_before(tmp_path) -> None:
    first: list[bytes] = []
    second: list[bytes] = []
    outer = libllama.route_log(lambda level, text: first.append(text))
    try:
        inner = libllama.route_log(lambda level, text: second.append(text))
        load_nothing(str(tmp_path / "a.gguf"))
        assert any(b"a.gguf" in t for t in second) and not first
        libllama.restore_log(inner)
        load_nothing(str(tmp_path / "b.gguf"))
        assert any(b"b.gguf" in t for t in first)
        assert not any(b"b.gguf" in t for t in second)
    finally:
        libllama.restore_log(outer)
