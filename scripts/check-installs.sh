#!/usr/bin/env bash
# The installs check: what a user installs is what is tested. The test suite runs in one
# environment holding every extra (and torch); this makes, for each extra a user is told to
# install (docs/install.md), a fresh virtual environment with the README's install
# (scripts/install.sh: llama-cpp-python from the wheel it cached, nothing compiled again) and
# that extra alone, and runs the extra's documented path there end to end on the built-in tiny
# models (scripts/check_install_paths.py says which steps; `import torch` must fail in each).
#
# Usage:  bash scripts/check-installs.sh                 # none, serve, gguf-tokenizer
#         bash scripts/check-installs.sh serve ...       # only these extras
#         bash scripts/check-installs.sh --here EXTRA [--only STEP,...]
#                                       # EXTRA's steps (or some) in the active environment:
#                                       # no new environment, nothing installed
#
# .ci/run runs it after the README's two commands, so the wheel is cached (without it,
# `install.sh --wheel-only` compiles llama.cpp here once, before the environments take it).
# Exit 1 when any extra's install or step fails.
#
# Environment:
#   PYTHON                the interpreter the environments are made from (default: python3)
#   MOSS_GGUF_CACHE       install.sh's cache (default: ~/.cache/moss-gguf)
#   CHECK_INSTALLS_DIR    where the environments and outputs go (default: a temporary folder,
#                         removed at the end)
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD

log() { echo "check-installs: $*" >&2; }
die() { log "error: $*"; exit 1; }

EXTRAS_ALL=(none serve gguf-tokenizer)
if [[ "${1:-}" == --here ]]; then
    [[ $# -ge 2 ]] || die "--here takes an extra (${EXTRAS_ALL[*]}), then maybe --only STEP,..."
    work=$(mktemp -d "${TMPDIR:-/tmp}/check-installs-here.XXXXXX")
    trap 'rm -rf "$work"' EXIT
    python "$REPO/scripts/check_install_paths.py" "$2" "$work" "${@:3}"
    exit
fi
EXTRAS=("$@")
[[ ${#EXTRAS[@]} -gt 0 ]] || EXTRAS=("${EXTRAS_ALL[@]}")
for extra in "${EXTRAS[@]}"; do
    [[ " ${EXTRAS_ALL[*]} " == *" $extra "* ]] || die "unknown extra '$extra' (${EXTRAS_ALL[*]})"
done

PYTHON=${PYTHON:-python3}
if [[ -n "${CHECK_INSTALLS_DIR:-}" ]]; then
    ROOT=$CHECK_INSTALLS_DIR
    mkdir -p "$ROOT"
else
    ROOT=$(mktemp -d "${TMPDIR:-/tmp}/check-installs.XXXXXX")
    trap 'rm -rf "$ROOT"' EXIT
fi

# One extra's fresh environment: the README's install (install.sh), then the extra as
# docs/install.md says. Run in a subshell, so that the activation ends with it.
install_extra() {
    local extra=$1 dir="$ROOT/$1" start=$SECONDS
    rm -rf "$dir"
    mkdir -p "$dir"
    "$PYTHON" -m venv "$dir/venv"
    # shellcheck disable=SC1091
    . "$dir/venv/bin/activate"
    bash scripts/install.sh 2>"$dir/install.log" \
        || { cat "$dir/install.log" >&2; die "$extra: scripts/install.sh failed"; }
    grep -q "using the cached llama-cpp-python wheel" "$dir/install.log" \
        || { cat "$dir/install.log" >&2; die "$extra: llama-cpp-python was compiled again"; }
    if [[ "$extra" != none ]]; then
        python -m pip install --quiet ".[$extra]" 2>>"$dir/install.log" \
            || { cat "$dir/install.log" >&2; die "$extra: pip install '.[$extra]' failed"; }
    fi
    log "$extra: installed in $((SECONDS - start)) s"
}

# The wheel first (command 1 cached it; if not, it is compiled here once, not per extra)
PYTHON=$PYTHON bash scripts/install.sh --wheel-only
START=$SECONDS
# One install at a time (pip builds the package inside this tree), the next one beside the
# steps of the one before: each is mostly one busy core, and the machine may have two.
(install_extra "${EXTRAS[0]}")
for i in "${!EXTRAS[@]}"; do
    extra=${EXTRAS[$i]} next=${EXTRAS[$((i + 1))]:-} installing=""
    if [[ -n "$next" ]]; then
        (install_extra "$next") &
        installing=$!
    fi
    passed=1  # the steps as in the activated environment
    PATH="$ROOT/$extra/venv/bin:$PATH" VIRTUAL_ENV="$ROOT/$extra/venv" \
        "$ROOT/$extra/venv/bin/python" scripts/check_install_paths.py "$extra" "$ROOT/$extra/work" \
        || passed=0
    if [[ -n "$installing" ]]; then
        wait "$installing" || die "$next: the install failed (above)"
    fi
    [[ $passed == 1 ]] || die "$extra: a documented path failed (above)"
done
log "every extra passed (${EXTRAS[*]}) in $((SECONDS - START)) s"
