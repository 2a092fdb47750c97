#!/usr/bin/env bash
# The Python virtual environments of the framework tests (tests/frameworks/): the real PyTorch
# (CUDA 13) or JAX + CuPy (CUDA 12) wheels from PyPI, which the tests run on gpuvisor's simulator.
#
#   venv.sh NAME       NAME = torch | jax | tools: builds (or reuses) the venv pinned by
#                      tests/frameworks/requirements-NAME.txt and prints its python on stdout
#
# The venv lives in ${GPUVISOR_FRAMEWORKS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gpuvisor-ci}/
# venv-NAME-<the first 16 hex digits of the requirements file's SHA-256>: a changed pin makes a
# new venv, and the other venvs of NAME are removed before it is built (each is ~5 GB).
# It is built beside its final place and renamed into it, with a marker file written last, so a
# half-built venv is never used; builds of one NAME are serialised with a lock. pip's own cache is
# used as usual. PYTHON picks the interpreter (default python3; checked with Python 3.11).
# Logs go to stderr. docs/frameworks-tests.md says more.
set -euo pipefail
[ $# -eq 1 ] || { sed -n '5,7p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
name=$1
here=$(cd "$(dirname "$0")" && pwd)
requirements=$here/requirements-$name.txt
[ -f "$requirements" ] || {
  echo "venv.sh: no $requirements (NAME is torch, jax or tools)" >&2
  exit 2
}
python=${PYTHON:-python3}
cache=${GPUVISOR_FRAMEWORKS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gpuvisor-ci}
key=$(sha256sum "$requirements" | cut -c1-16)
dir=$cache/venv-$name-$key
readonly marker=.gpuvisor-venv-complete

log() { echo "venv.sh: $*" >&2; }

# A venv is usable when its marker exists (written after everything else) and its interpreter
# still starts (the system python it points to may have been replaced).
usable() { [ -f "$1/$marker" ] && "$1/bin/python" -c 'import sys' 2>/dev/null; }

# Remove the other venvs of NAME (older pins) and leftovers of interrupted builds.
prune() {
  local old
  for old in "$cache/venv-$name-"* "$cache/.venv-$name-"*; do
    [ -e "$old" ] || continue
    [ "$old" = "$dir" ] && continue
    log "removing $old"
    rm -rf "$old"
  done
}

mkdir -p "$cache"
exec 9>"$cache/venv-$name.lock"
if ! flock -n 9; then
  log "waiting for another venv.sh $name (lock $cache/venv-$name.lock)"
  flock 9
fi

if usable "$dir"; then
  log "reusing $dir"
  prune
  echo "$dir/bin/python"
  exit 0
fi

if ! "$python" -m venv --help >/dev/null 2>&1 || ! "$python" -c 'import ensurepip' 2>/dev/null; then
  log "installing python3-venv"
  { apt-get update -qq && apt-get install -y -qq --no-install-recommends python3-venv; } >&2
fi

prune
rm -rf "$dir" # incomplete (no marker): never reused
tmp=$cache/.venv-$name-$key.tmp.$$
trap 'rm -rf "$tmp"' EXIT
started=$(date +%s)
log "building $dir from $(basename "$requirements") (a few GB; pip's cache: $("$python" -m pip cache dir 2>/dev/null || echo none))"
"$python" -m venv "$tmp" >&2
"$tmp/bin/python" -m pip install --disable-pip-version-check --progress-bar off -q -r "$requirements" >&2
"$tmp/bin/python" -m pip check >&2
# The venv is built under its temporary name: console scripts' shebangs and the activate scripts
# name that path. Point them at the final one (the tests run bin/python, which needs nothing).
# (grep -r skips symlinks, so bin/python itself is left alone.)
{ grep -rlF --null "$tmp" "$tmp/bin" 2>/dev/null || true; } | xargs -0 -r sed -i "s|$tmp|$dir|g"
date -u +%Y-%m-%dT%H:%M:%SZ >"$tmp/$marker"
mv -T "$tmp" "$dir"
trap - EXIT
log "built $dir in $(($(date +%s) - started)) s ($(du -sh "$dir" | cut -f1))"
echo "$dir/bin/python"
