"""llama.cpp's file types: the quantization type of a whole GGUF (`general.file_type`).

The table follows whatever llama.cpp is installed (llama-cpp-python's LLAMA_FTYPE_* constants
joined with gguf's LlamaFileType). Everything that names a file type — quantize, a
pre-converted repo's file names, `all`'s resume checks — parses it here.
"""

from __future__ import annotations

import functools

from ..errors import UsageError
from ..native import libllama

# llama-quantize's short aliases (its QUANT_OPTIONS table)
FILE_TYPE_ALIASES = {"Q3_K": "Q3_K_M", "Q4_K": "Q4_K_M", "Q5_K": "Q5_K_M"}


def _llama_name(constant: str) -> str | None:
    for prefix in ("LLAMA_FTYPE_MOSTLY_", "LLAMA_FTYPE_ALL_", "MOSTLY_", "ALL_"):
        if constant.startswith(prefix):
            return constant[len(prefix) :]
    return None


@functools.lru_cache(maxsize=1)
def file_type_table() -> dict[str, int]:
    """Every llama.cpp file type: NAME -> llama_ftype value.

    From llama-cpp-python's LLAMA_FTYPE_* constants (the library's own llama.h) joined with
    gguf's LlamaFileType, so the table follows whatever llama.cpp is installed.
    """
    table: dict[str, int] = {}
    try:
        import gguf

        for member in gguf.LlamaFileType:
            name = _llama_name(member.name)
            if name:
                table[name] = int(member.value)
    except Exception:  # noqa: BLE001 - the other source may still work
        pass
    try:
        llama_cpp = libllama.bindings()
        for attr in dir(llama_cpp):
            if attr.startswith("LLAMA_FTYPE_"):
                name = _llama_name(attr)
                if name:
                    table[name] = int(getattr(llama_cpp, attr))
    except Exception:  # noqa: BLE001
        pass
    return dict(sorted(table.items(), key=lambda kv: kv[1]))


def parse_file_type(name: str) -> str:
    """Canonical upper-case file type name for a case-insensitive name or alias."""
    table = file_type_table()
    key = name.strip().upper()
    key = FILE_TYPE_ALIASES.get(key, key)
    if key not in table:
        valid = ", ".join(list(table) + list(FILE_TYPE_ALIASES))
        raise UsageError(
            f"unknown quantization type {name!r}", hint=f"valid types (any case): {valid}"
        )
    return key
