#!/usr/bin/env bash
# Obtain a pinned llama.cpp source tree and build `llama-quantize`, without GitHub.
#
# The tree comes from the llama-cpp-python source distribution on PyPI (its
# vendor/llama.cpp), so the binary built here and the libllama bundled in the
# llama-cpp-python wheel of the same version are the same llama.cpp commit.
#
# Usage:  scripts/get-llama-cpp.sh            # prints the tree path as the last stdout line
#         export LLAMA_CPP_DIR="$(scripts/get-llama-cpp.sh | tail -n 1)"
#
# Environment:
#   LLAMA_CPP_PYTHON_VERSION  llama-cpp-python version to take llama.cpp from
#                             (default: the installed llama_cpp.__version__, else 0.3.36)
#   LLAMA_CPP_SDIST           path of an already downloaded llama_cpp_python-VER.tar.gz
#                             (skips `pip download`)
#   MOSS_GGUF_CACHE           cache root (default: ~/.cache/moss-gguf); the tree is
#                             $MOSS_GGUF_CACHE/llama.cpp-VER
#   MOSS_GGUF_BUILD_JOBS      parallel compile jobs (default: 2)
#
# A second run with a finished build does nothing and prints the path at once.
set -euo pipefail

log() { echo "get-llama-cpp: $*" >&2; }
die() { log "error: $*"; exit 1; }

PYTHON=${PYTHON:-python3}
command -v "$PYTHON" >/dev/null 2>&1 || PYTHON=python

if [[ -n "${LLAMA_CPP_PYTHON_VERSION:-}" ]]; then
    VER=$LLAMA_CPP_PYTHON_VERSION
else
    VER=$("$PYTHON" -c 'import llama_cpp; print(llama_cpp.__version__)' 2>/dev/null || true)
    VER=${VER:-0.3.36}
fi
[[ "$VER" =~ ^[0-9A-Za-z.+-]+$ ]] || die "odd version string: $VER"

CACHE=${MOSS_GGUF_CACHE:-$HOME/.cache/moss-gguf}
TREE="$CACHE/llama.cpp-$VER"
BIN="$TREE/build/bin/llama-quantize"
DONE="$TREE/.moss-gguf-built"
JOBS=${MOSS_GGUF_BUILD_JOBS:-2}

# Fast path: nothing to do.
if [[ -f "$DONE" && -x "$BIN" ]]; then
    echo "$TREE"
    exit 0
fi

mkdir -p "$CACHE"
# Serialize concurrent runs (CI steps, test fixtures) on the same version.
if command -v flock >/dev/null 2>&1; then
    exec 9>"$CACHE/.llama.cpp-$VER.lock"
    flock 9
    if [[ -f "$DONE" && -x "$BIN" ]]; then
        echo "$TREE"
        exit 0
    fi
fi

WORK=""
cleanup() { [[ -n "$WORK" && -d "$WORK" ]] && rm -rf "$WORK"; return 0; }
trap cleanup EXIT

if [[ ! -f "$TREE/.moss-gguf-pin" ]]; then
    WORK=$(mktemp -d "$CACHE/.tmp-llama.cpp-$VER.XXXXXX")
    SDIST=${LLAMA_CPP_SDIST:-}
    if [[ -z "$SDIST" ]]; then
        log "downloading llama-cpp-python==$VER source distribution from PyPI"
        # --no-binary for this package only: ":all:" would also compile pip's build
        # dependencies (the cmake package) from source, which takes very long
        "$PYTHON" -m pip download --quiet --no-deps --no-binary llama-cpp-python \
            --dest "$WORK/dl" "llama-cpp-python==$VER" >&2 \
            || die "pip download llama-cpp-python==$VER failed (set LLAMA_CPP_SDIST to a local sdist)"
        SDIST=$(ls "$WORK"/dl/llama_cpp_python-*.tar.gz 2>/dev/null | head -n 1)
        [[ -n "$SDIST" ]] || die "pip download produced no llama_cpp_python-*.tar.gz"
    fi
    [[ -f "$SDIST" ]] || die "sdist not found: $SDIST"
    TOP="llama_cpp_python-$VER"
    log "extracting $TOP/vendor/llama.cpp from $SDIST"
    mkdir -p "$WORK/x"
    # The submodule's git metadata rides along so the build records the real commit.
    tar -xzf "$SDIST" -C "$WORK/x" "$TOP/vendor/llama.cpp" "$TOP/.git/modules/vendor/llama.cpp" \
        2>/dev/null \
        || tar -xzf "$SDIST" -C "$WORK/x" "$TOP/vendor/llama.cpp" \
        || die "$SDIST has no $TOP/vendor/llama.cpp (version mismatch?)"
    SRC="$WORK/x/$TOP/vendor/llama.cpp"
    [[ -f "$SRC/CMakeLists.txt" && -f "$SRC/convert_hf_to_gguf.py" ]] \
        || die "$SDIST: vendor/llama.cpp is incomplete"

    COMMIT=""
    MOD="$WORK/x/$TOP/.git/modules/vendor/llama.cpp"
    rm -f "$SRC/.git"
    if [[ -f "$MOD/HEAD" ]]; then
        COMMIT=$(tr -d '[:space:]' <"$MOD/HEAD")
        # Turn the submodule gitdir into the tree's own .git so `git rev-parse` (used by
        # llama.cpp's build-info) works; drop worktree/credential settings of the sdist's CI.
        mv "$MOD" "$SRC/.git"
        "$PYTHON" - "$SRC/.git/config" <<'PYEOF'
import re, sys
path = sys.argv[1]
text = open(path).read()
# core.worktree points into the sdist layout; [includeIf]/[url] name the sdist builder's paths
text = re.sub(r"(?m)^[ \t]*worktree[ \t]*=.*\n", "", text)
text = re.sub(r"(?m)^\[(includeIf|url) [^\]]*\]\n(?:[ \t]+[^\n]*\n)*", "", text)
open(path, "w").write(text)
PYEOF
    fi
    if [[ ! "$COMMIT" =~ ^[0-9a-f]{40}$ ]]; then
        # No usable git metadata: make sure git cannot wander up into an unrelated repo.
        rm -rf "$SRC/.git"
        git init --quiet "$SRC" >&2 || true
        COMMIT=unknown
    fi
    {
        echo "llama_cpp_python=$VER"
        echo "llama_cpp_commit=$COMMIT"
        echo "sdist=$(basename "$SDIST")"
    } >"$SRC/.moss-gguf-pin"

    rm -rf "$TREE"
    mv "$SRC" "$TREE"
    log "tree: $TREE (llama.cpp $COMMIT)"
fi

command -v cmake >/dev/null 2>&1 || die "cmake is required to build llama-quantize"

# Portable CPU flags: -march=native misbehaves on some hosts (AMX), and results must not
# depend on the build machine.
CMAKE_FLAGS=(
    -DCMAKE_BUILD_TYPE=Release
    -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON
    -DGGML_AVX512=ON
    -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF
    -DLLAMA_BUILD_APP=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF
)
GEN=()
if [[ ! -f "$TREE/build/CMakeCache.txt" ]] && command -v ninja >/dev/null 2>&1; then
    GEN=(-G Ninja)
fi

START=$(date +%s)
log "configuring (cmake ${CMAKE_FLAGS[*]})"
cmake -S "$TREE" -B "$TREE/build" "${GEN[@]}" "${CMAKE_FLAGS[@]}" >&2
log "building llama-quantize with $JOBS jobs (takes a few minutes)"
cmake --build "$TREE/build" --config Release --target llama-quantize -j "$JOBS" >&2
[[ -x "$BIN" ]] || die "build finished but $BIN is missing"
END=$(date +%s)
log "built $BIN in $((END - START)) s"

date -u +%Y-%m-%dT%H:%M:%SZ >"$DONE"
echo "$TREE"
