"""llama.cpp and ggml as built for this machine: the pinned versions (pins), the CPU features
the build is made for (cpu_features), finding the llama.cpp tree and running its tools
(llama_tools), and the ctypes loader of llama-cpp-python's libggml (libggml).

May import: the top level (errors, progress, report, hold_points) only (rank 1; disk/ is beside it,
never imported).
`python -m moss_gguf_cli.native.pins` and `python -m moss_gguf_cli.native.cpu_features`
run before anything is installed (scripts/install.sh): keep this package free of imports.
"""
