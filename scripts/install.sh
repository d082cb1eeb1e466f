#!/usr/bin/env bash
# Install moss-gguf into the active Python environment, with llama-cpp-python (which compiles
# llama.cpp) built for the CPU this runs on.
#
# Usage:  bash scripts/install.sh          # the tool:  pip install .
#         bash scripts/install.sh --test   # for the tests: pip install -e '.[test]' torch (CPU),
#                                          # llama-quantize from the same llama.cpp build, and
#                                          # Debian's chromium + chromium-driver (apt-get, as
#                                          # root; skipped when both are installed) for the
#                                          # browser tests of serve's page
#         bash scripts/install.sh --wheel-only # the llama-cpp-python wheel in the cache
#                                              # (built if missing), nothing installed:
#                                              # scripts/check-installs.sh, before the fresh
#                                              # environments that take it from there
#         bash scripts/install.sh --gpu cuda   # llama.cpp with a GPU backend as well:
#                                              # cuda, vulkan or metal (the CPU build is the
#                                              # default; `moss-gguf doctor` says what is
#                                              # offloaded). Its toolkit must be installed:
#                                              # nvcc (CUDA), the Vulkan SDK, Xcode (Metal).
#
# The llama.cpp CPU flags come from /proc/cpuinfo (python -m moss_gguf_cli.native.cpu_features):
# every instruction set this CPU has, AMX never. The llama-cpp-python wheel and its cmake
# build folder are cached under $MOSS_GGUF_CACHE (default ~/.cache/moss-gguf), keyed by the
# pinned version and the flags, so a second install (or --test after a plain install)
# compiles nothing, and scripts/get-llama-cpp.sh links llama-quantize against that build.
#
# Environment:
#   PYTHON                  the interpreter (default: python, else python3)
#   MOSS_GGUF_CACHE         cache root (default: ~/.cache/moss-gguf)
#   MOSS_GGUF_BUILD_JOBS    parallel compile jobs (default: the number of cores)
#   MOSS_GGUF_REBUILD=1     build llama-cpp-python again even if the installed one is the pin
set -euo pipefail
cd "$(dirname "$0")/.."

log() { echo "install: $*" >&2; }
die() { log "error: $*"; exit 1; }

# headless Chromium and its WebDriver for tests/test_serve_page.py (Selenium drives them)
browser_for_tests() {
    if command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1; then
        log "chromium and chromedriver are installed"
        return
    fi
    local sudo=()
    if [[ $(id -u) != 0 ]]; then
        sudo -n true 2>/dev/null \
            || die "the browser tests need Debian's chromium and chromium-driver: run as root" \
                   "(or: sudo apt-get install chromium chromium-driver)"
        sudo=(sudo -n)
    fi
    command -v apt-get >/dev/null 2>&1 \
        || die "no apt-get here: install chromium and its chromedriver with this system's packages"
    log "installing Debian's chromium and chromium-driver (apt-get)"
    "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -q >&2
    "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive \
        apt-get install -y -q --no-install-recommends chromium chromium-driver >&2
}

PYTHON=${PYTHON:-python}
command -v "$PYTHON" >/dev/null 2>&1 || PYTHON=python3
MODE=tool
GPU=""
while [[ $# -gt 0 ]]; do
    case "$1" in
        --test) MODE=test ;;
        --wheel-only) MODE=wheel ;;
        --gpu)
            GPU=${2:-}
            shift ;;
        *) die "unknown option ${1} (use --test, --wheel-only, --gpu cuda|vulkan|metal, or nothing)" ;;
    esac
    shift
done
case "$GPU" in
    "") GPU_ARGS="" ;;
    cuda) GPU_ARGS="-DGGML_CUDA=on" ;;
    vulkan) GPU_ARGS="-DGGML_VULKAN=on" ;;
    metal) GPU_ARGS="-DGGML_METAL=on" ;;
    *) die "--gpu takes cuda, vulkan or metal, not '${GPU}'" ;;
esac

VER=$("$PYTHON" -m moss_gguf_cli.native.pins llama-cpp-python)
ARGS=$("$PYTHON" -m moss_gguf_cli.native.cpu_features --cmake-args)
KEY=$("$PYTHON" -m moss_gguf_cli.native.cpu_features --key)
if [[ -n "$GPU" ]]; then  # a build of its own: the CPU wheel in the cache stays as it is
    ARGS="$ARGS $GPU_ARGS"
    KEY="$KEY-$GPU"
fi
CACHE=${MOSS_GGUF_CACHE:-$HOME/.cache/moss-gguf}
WHEELS="$CACHE/wheels/llama-cpp-python-$VER-$KEY"
BUILD="$CACHE/build/llama-cpp-python-$VER-$KEY"
export CMAKE_BUILD_PARALLEL_LEVEL=${MOSS_GGUF_BUILD_JOBS:-$(nproc 2>/dev/null || echo 2)}
START=$(date +%s)

installed="" offloads=0
if [[ "$MODE" != wheel ]]; then  # --wheel-only: the cached wheel alone matters
    installed=$("$PYTHON" -c 'import llama_cpp; print(llama_cpp.__version__)' 2>/dev/null || true)
    offloads=$("$PYTHON" -c 'import llama_cpp; print(int(llama_cpp.llama_supports_gpu_offload()))' \
        2>/dev/null || echo 0)
fi
if [[ -n "$GPU" && "$offloads" != 1 ]]; then
    installed=""  # the installed build has no GPU backend: build the one asked for
fi
if [[ "$installed" == "$VER" && "${MOSS_GGUF_REBUILD:-}" != 1 ]]; then
    log "llama-cpp-python $VER is installed; keeping it (MOSS_GGUF_REBUILD=1 builds it again)"
else
    wheel=$(ls "$WHEELS"/llama_cpp_python-"$VER"-*.whl 2>/dev/null | head -n 1 || true)
    if [[ -z "$wheel" || "${MOSS_GGUF_REBUILD:-}" == 1 ]]; then
        log "building llama-cpp-python $VER for this CPU: ${ARGS:-llama.cpp defaults}"
        log "(compiles llama.cpp: about 4 minutes on 2 cores)"
        SDIST=$(bash scripts/get-llama-cpp.sh --sdist | tail -n 1)
        rm -rf "$WHEELS.tmp" && mkdir -p "$WHEELS.tmp" "$BUILD"
        # A build folder of our own (not pip's temporary one) so that get-llama-cpp.sh can
        # link llama-quantize against the libraries built here instead of compiling them again.
        SKBUILD_BUILD_DIR="$BUILD" CMAKE_ARGS="$ARGS" \
            "$PYTHON" -m pip wheel --quiet --no-deps --no-cache-dir -w "$WHEELS.tmp" "$SDIST" >&2 \
            || die "building llama-cpp-python failed (see above)"
        echo "$ARGS" >"$BUILD/.moss-gguf-cmake-args"
        rm -rf "$WHEELS" && mv "$WHEELS.tmp" "$WHEELS"
        wheel=$(ls "$WHEELS"/llama_cpp_python-"$VER"-*.whl | head -n 1)
    else
        log "using the cached llama-cpp-python wheel $(basename "$wheel")"
    fi
    if [[ "$MODE" == wheel ]]; then
        log "the wheel is $wheel"
        exit 0
    fi
    "$PYTHON" -m pip install --quiet --force-reinstall --no-deps "$wheel" >&2
    # its own dependencies (numpy, jinja2, diskcache, typing-extensions)
    "$PYTHON" -m pip install --quiet "$wheel" >&2
fi

if [[ "$MODE" == tool ]]; then
    "$PYTHON" -m pip install --quiet . >&2
else
    # torch pinned: the CPU wheel; a bare `torch` can pull a multi-GB CUDA build
    "$PYTHON" -m pip install --quiet -e '.[test]' torch==2.13.0 >&2
    bash scripts/get-llama-cpp.sh >/dev/null
    browser_for_tests
fi
log "done in $(( $(date +%s) - START )) s"
