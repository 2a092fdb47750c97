#!/bin/sh
# Added cost of the shim on one cuMemAlloc_v2 + cuMemFree_v2 pair: the same benchmark against
# a driver directly and with the shim preloaded (budget set, far from the limit).
#   crates/gpuvisor-shim/benches/run.sh DRIVER_DIR [ITERATIONS]
# DRIVER_DIR holds libcuda.so.1: the C fake from tests/c (lock-free; isolates the shim's cost)
# or gpuvisor-sim. Builds the shim with plain rustc (release) and the benchmark with cc.
# A quick check against any libcuda.so.1; the published figures (docs/benchmarks.md) come from
# `python3 scripts/bench.py`, which measures through `gpuvisor exec` with medians and callgrind.
set -eu
driver_dir=$(cd "$1" && pwd)
iterations=${2:-2000000}
root=$(cd "$(dirname "$0")/../../.." && pwd)
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
rustc --edition 2021 --crate-type rlib --crate-name gpuvisor_ledger -O "$root/crates/gpuvisor-ledger/src/lib.rs" --out-dir "$out"
rustc --edition 2021 --crate-type cdylib --crate-name gpuvisor_shim -O \
    --extern gpuvisor_ledger="$out/libgpuvisor_ledger.rlib" "$root/crates/gpuvisor-shim/src/lib.rs" --out-dir "$out"
cc -O2 -pthread "$root/crates/gpuvisor-shim/benches/alloc_free.c" -L"$driver_dir" -l:libcuda.so.1 -o "$out/alloc_free"
cargo run -q --release -p gpuvisor-ledger --example ledger_tool -- create "$out/ledger" \
    GPU-5111a7ed-0000-4000-8000-000000000000=85899345920 "bench:80000000000:-"
export LD_LIBRARY_PATH="$driver_dir" GPUVISOR_SIM_GPUS=80GiB
for threads in 1 8; do
    for round in 1 2 3; do
        printf 'direct  '; "$out/alloc_free" "$threads" "$iterations"
        printf 'shim    '; LD_PRELOAD="$out/libgpuvisor_shim.so" GPUVISOR_LEDGER="$out/ledger" "$out/alloc_free" "$threads" "$iterations"
    done
done
