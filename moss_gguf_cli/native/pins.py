"""The one pinned llama.cpp: the llama-cpp-python release whose vendored tree we build and test.

``pyproject.toml`` requires exactly this version; ``scripts/install.sh``,
``scripts/get-llama-cpp.sh`` and the tests read it from here
(``python -m moss_gguf_cli.native.pins llama-cpp-python``), so a new llama-cpp-python release
cannot change what CI tests without a commit. Stdlib only: the scripts run it before
anything is installed.
"""

from __future__ import annotations

import sys

LLAMA_CPP_PYTHON = "0.3.36"

PINS = {"llama-cpp-python": LLAMA_CPP_PYTHON}


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[1] not in PINS:
        print(f"usage: python -m moss_gguf_cli.native.pins {{{','.join(PINS)}}}", file=sys.stderr)
        return 2
    print(PINS[argv[1]])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
