#!/usr/bin/env bash
# Obtain the pinned llama.cpp source tree and a `llama-quantize` built from it, without GitHub.
#
# The tree comes from the llama-cpp-python source distribution on PyPI (its vendor/llama.cpp),
# at the version pinned in moss_gguf_cli/native/pins.py, so the binary and the libllama inside the
# installed llama-cpp-python are the same llama.cpp commit. When scripts/install.sh built that
# llama-cpp-python here, its cmake build folder is still in the cache and llama-quantize is
# linked against the libraries built there: two source files compiled, nothing else. Without
# that folder the tool is built from the tree, with the same CPU flags.
#
# Usage:  scripts/get-llama-cpp.sh            # prints the tree path as the last stdout line
#         scripts/get-llama-cpp.sh --sdist    # only fetch the sdist; prints its path
#
# The tests and moss-gguf find the tree at its cache path by themselves; LLAMA_CPP_DIR
# overrides that.
#
# Environment:
#   LLAMA_CPP_SDIST           path of an already downloaded llama_cpp_python-VER.tar.gz
#   MOSS_GGUF_CACHE           cache root (default: ~/.cache/moss-gguf); the tree is
#                             $MOSS_GGUF_CACHE/llama.cpp-VER
#   MOSS_GGUF_BUILD_JOBS      parallel compile jobs (default: the number of cores)
#
# A second run with a finished build does nothing and prints the path at once.
set -euo pipefail
cd "$(dirname "$0")/.."

log() { echo "get-llama-cpp: $*" >&2; }
die() { log "error: $*"; exit 1; }

PYTHON=${PYTHON:-python}
command -v "$PYTHON" >/dev/null 2>&1 || PYTHON=python3

VER=$("$PYTHON" -m moss_gguf_cli.native.pins llama-cpp-python)
[[ "$VER" =~ ^[0-9A-Za-z.+-]+$ ]] || die "odd version string: $VER"
ARGS=$("$PYTHON" -m moss_gguf_cli.native.cpu_features --cmake-args)
KEY=$("$PYTHON" -m moss_gguf_cli.native.cpu_features --key)

CACHE=${MOSS_GGUF_CACHE:-$HOME/.cache/moss-gguf}
TREE="$CACHE/llama.cpp-$VER"
BIN="$TREE/build/bin/llama-quantize"
DONE="$TREE/.moss-gguf-built"
WHEEL_BUILD="$CACHE/build/llama-cpp-python-$VER-$KEY"
JOBS=${MOSS_GGUF_BUILD_JOBS:-$(nproc 2>/dev/null || echo 2)}
mkdir -p "$CACHE"

# The sdist, downloaded once into the cache (pip's own cache does not keep sdists).
fetch_sdist() {
    if [[ -n "${LLAMA_CPP_SDIST:-}" ]]; then
        [[ -f "$LLAMA_CPP_SDIST" ]] || die "LLAMA_CPP_SDIST not found: $LLAMA_CPP_SDIST"
        SDIST=$LLAMA_CPP_SDIST
        return
    fi
    SDIST="$CACHE/sdist/llama_cpp_python-$VER.tar.gz"
    [[ -f "$SDIST" ]] && return
    log "downloading llama-cpp-python==$VER source distribution from PyPI"
    local dl
    dl=$(mktemp -d "$CACHE/.tmp-sdist.XXXXXX")
    # --no-binary for this package only: ":all:" would also compile pip's build
    # dependencies (the cmake package) from source, which takes very long
    "$PYTHON" -m pip download --quiet --no-deps --no-binary llama-cpp-python \
        --dest "$dl" "llama-cpp-python==$VER" >&2 \
        || { rm -rf "$dl"; die "pip download llama-cpp-python==$VER failed (set LLAMA_CPP_SDIST to a local sdist)"; }
    mkdir -p "$CACHE/sdist"
    mv "$dl"/llama_cpp_python-*.tar.gz "$SDIST" 2>/dev/null \
        || { rm -rf "$dl"; die "pip download produced no llama_cpp_python-*.tar.gz"; }
    rm -rf "$dl"
}

if [[ "${1:-}" == --sdist ]]; then
    fetch_sdist
    echo "$SDIST"
    exit 0
fi
[[ -z "${1:-}" ]] || die "unknown option ${1} (use --sdist, or nothing)"

# Fast path: nothing to do.
if [[ -f "$DONE" && -x "$BIN" ]]; then
    echo "$TREE"
    exit 0
fi

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
    fetch_sdist
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

START=$(date +%s)
mkdir -p "$TREE/build/bin"
if [[ -f "$WHEEL_BUILD/.moss-gguf-cmake-args" && -f "$WHEEL_BUILD/bin/libllama.so" \
      && -f "$WHEEL_BUILD/bin/libllama-common.so" ]]; then
    # scripts/install.sh built llama-cpp-python from this very sdist here, with the flags of
    # this CPU, and kept its build folder: libllama, libggml and llama.cpp's common library
    # (imatrix loading) are built already. Only the tool's own two files are compiled.
    log "linking llama-quantize against the llama-cpp-python build in $WHEEL_BUILD"
    CXX=${CXX:-c++}
    command -v "$CXX" >/dev/null 2>&1 || die "a C++ compiler ($CXX) is required"
    Q="$TREE/tools/quantize"
    "$CXX" -std=c++17 -O3 -DNDEBUG -pthread \
        -I"$TREE/include" -I"$TREE/ggml/include" -I"$TREE/common" -I"$Q" \
        "$Q/quantize.cpp" "$Q/main.cpp" \
        -L"$WHEEL_BUILD/bin" -lllama-common -lllama -lggml -lggml-base \
        -Wl,-rpath,"$WHEEL_BUILD/bin" -o "$BIN.tmp" >&2 \
        || die "compiling llama-quantize against $WHEEL_BUILD failed"
    mv "$BIN.tmp" "$BIN"
    echo "linked against $WHEEL_BUILD/bin" >"$TREE/build/.moss-gguf-linked"
else
    command -v cmake >/dev/null 2>&1 || die "cmake is required to build llama-quantize"
    # The same CPU flags scripts/install.sh gives llama-cpp-python (moss_gguf_cli.native.cpu_features).
    read -r -a CPU_FLAGS <<<"$ARGS"
    CMAKE_FLAGS=(
        -DCMAKE_BUILD_TYPE=Release
        "${CPU_FLAGS[@]}"
        -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF
        -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF
        -DLLAMA_BUILD_APP=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF
    )
    GEN=()
    if [[ ! -f "$TREE/build/CMakeCache.txt" ]] && command -v ninja >/dev/null 2>&1; then
        GEN=(-G Ninja)
    fi
    log "no llama-cpp-python build of scripts/install.sh in the cache: building from the tree"
    log "configuring (cmake ${CMAKE_FLAGS[*]})"
    cmake -S "$TREE" -B "$TREE/build" "${GEN[@]}" "${CMAKE_FLAGS[@]}" >&2
    log "building llama-quantize with $JOBS jobs (takes a few minutes)"
    cmake --build "$TREE/build" --config Release --target llama-quantize -j "$JOBS" >&2
fi
[[ -x "$BIN" ]] || die "build finished but $BIN is missing"
END=$(date +%s)
log "built $BIN in $((END - START)) s"

date -u +%Y-%m-%dT%H:%M:%SZ >"$DONE"
echo "$TREE"
