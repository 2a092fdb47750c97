#!/usr/bin/env bash
# A Python virtual environment with jax (CPU, from PyPI) for the Slurm tests' multi-process workers.
#
#   venv.sh DIR        creates DIR (or reuses it when it already has the pinned jax) and prints
#                      DIR/bin/python on stdout
#
# jax is pinned: 0.10.2 was checked here with CPU multi-process collectives (gloo) across three
# Slurm nodes, with explicit jax.distributed.initialize(coordinator_address=..., num_processes=...,
# process_id=...) and with plain initialize() (Slurm auto-detection); see tests/slurm/allgather.py.
# PYTHON picks the interpreter (default python3; checked with Python 3.11, which jax 0.10 supports).
set -euo pipefail
readonly JAX_VERSION=0.10.2
[ $# -eq 1 ] || { sed -n '2,6p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
dir=$1
python=${PYTHON:-python3}
if [ -x "$dir/bin/python" ] &&
  "$dir/bin/python" -c "import jax, sys; sys.exit(jax.__version__ != '$JAX_VERSION')" 2>/dev/null; then
  echo "$dir/bin/python"
  exit 0
fi
if ! "$python" -m venv --help >/dev/null 2>&1 || ! "$python" -c 'import ensurepip' 2>/dev/null; then
  apt-get update -qq && apt-get install -y -qq --no-install-recommends python3-venv >/dev/null
fi
rm -rf "$dir"
"$python" -m venv "$dir" >&2
"$dir/bin/pip" install -q --disable-pip-version-check "jax==$JAX_VERSION" >&2
"$dir/bin/python" -c "import jax; assert jax.__version__ == '$JAX_VERSION', jax.__version__" >&2
echo "$dir/bin/python"
