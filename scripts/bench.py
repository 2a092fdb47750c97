#!/usr/bin/env python3
"""Regenerates docs/benchmarks.md: every performance figure of gpuvisor, measured in one run.

Usage: python3 scripts/bench.py [--quick] [--only SECTION ...]

Each section measures side by side where there is a comparison (with and without the shim,
gpuvisor against other tools) and reports ratios, so the figures hold on any machine of the
same kind. Needs: cargo, cc. Sections: planner, explain, shim-alloc, shim-startup.
"""
import argparse
import datetime
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "benchmarks.md"


def sh(args, **kwargs):
    """Runs a command, failing loudly with its output."""
    result = subprocess.run(args, capture_output=True, text=True, **kwargs)
    if result.returncode != 0:
        sys.exit(f"bench: {' '.join(map(str, args))} failed ({result.returncode}):\n{result.stdout}\n{result.stderr}")
    return result


def machine():
    cpu = "unknown CPU"
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return f"{cpu}, {os.cpu_count()} cores, {mem:.0f} GiB, {platform.system()} {platform.release()}"


def build():
    sh(["cargo", "build", "--release", "-p", "gpuvisor-cli"], cwd=ROOT)
    return ROOT / "target" / "release" / "gpuvisor"


def criterion_estimate(output, name):
    """The middle estimate of criterion's `time: [low mid high]` line for bench `name`."""
    match = re.search(re.escape(name) + r"\s+time:\s+\[\S+ \S+ (\S+) (\S+) \S+ \S+\]", output)
    if not match:
        sys.exit(f"bench: no criterion estimate for {name} in:\n{output}")
    value, unit = float(match.group(1)), match.group(2)
    return value * {"ns": 1e-9, "µs": 1e-6, "us": 1e-6, "ms": 1e-3, "s": 1.0}[unit]


def section_planner(args):
    result = sh(["cargo", "bench", "-p", "gpuvisor-core", "--bench", "plan", "--", "--noplot"], cwd=ROOT)
    rows = []
    for name in re.findall(r"^(plan/\S+)\s+time:", result.stdout, re.M):
        rows.append((name, criterion_estimate(result.stdout, name)))
    lines = ["## Planner", "", "Target: 1,000 replicas over 8 GPUs planned in under 10 ms.", "",
             "| benchmark | time per plan |", "|---|---|"]
    lines += [f"| `{name}` | {seconds * 1e3:.3f} ms |" for name, seconds in rows]
    lines += ["", "Measured by `cargo bench -p gpuvisor-core --bench plan` (criterion)."]
    return lines


def _explain_block(seed=7, target=8 << 20):
    """About 8 MiB of ordinary training-log lines (no failure), mixed the way real logs are."""
    import random
    rng = random.Random(seed)
    templates = [
        "[rank{r}] step {n} | loss {f:.4f} | lr 3.0e-04 | grad_norm {g:.3f} | {t} tokens/s | mem {mb} MiB",
        "{d} I external/xla/xla/service/service.cc:168] XLA service 0x{h:x} initialized for platform CUDA (this does not guarantee that XLA will be used). Devices:",
        "INFO:train:epoch {c} batch {n}/{t} reward={f:.3f} episode_len={t} fps={mb}",
        "  File \"/opt/venv/lib/python3.11/site-packages/torch/nn/modules/module.py\", line {n}, in _call_impl",
        "{d} W warnings.py:109] UserWarning: The given NumPy array is not writable, and PyTorch does not support non-writable tensors.",
        "{{\"step\": {n}, \"loss\": {f:.5f}, \"throughput\": {t}, \"gpu_mem_gib\": {g:.2f}}}",
        "Epoch {c}:  {p}%|####      | {n}/{t} [02:11<03:09,  3.12it/s, loss={f:.3f}]",
        "[collector-{c}] frames={t} fps={mb} episodes={n} return_mean={f:.2f}",
        "node{c}:{t}:{t} [{c}] NCCL INFO Channel 0{c}/0 : {c}[{c}] -> {r}[{r}] via P2P/IPC/read",
    ]
    weights = [30, 5, 20, 8, 5, 20, 10, 10, 0.2]
    lines, size = [], 0
    while size < target:
        line = rng.choices(templates, weights)[0].format(
            r=rng.randrange(8), n=rng.randrange(10**6), f=rng.random() * 5, g=rng.random() * 10,
            t=rng.randrange(10**5), mb=rng.randrange(80000), h=rng.getrandbits(40), c=rng.randrange(8),
            p=rng.randrange(100), d=f"2026-11-21 0{rng.randrange(10)}:{rng.randrange(60):02d}:{rng.randrange(60):02d}.{rng.randrange(10**6):06d}:")
        lines.append(line)
        size += len(line) + 1
    return ("\n".join(lines) + "\n").encode()


def _timed(command, runs):
    """Median wall seconds and median CPU seconds (user + system) of `command`, output discarded."""
    walls, cpus = [], []
    for _ in range(runs):
        before = os.times()
        start = time.perf_counter()
        result = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        walls.append(time.perf_counter() - start)
        after = os.times()
        cpus.append((after.children_user - before.children_user) + (after.children_system - before.children_system))
        if result.returncode != 0:
            sys.exit(f"bench: {command} failed: {result.stderr.decode(errors='replace')}")
    return statistics.median(walls), statistics.median(cpus), result.stdout.decode(errors="replace")


def section_explain(args):
    """`gpuvisor explain` on a 1 GiB log against `wc -l` (the cost of reading it at all)."""
    binary = build()
    runs = 1 if args.quick else 3
    size = (256 << 20) if args.quick else (1 << 30)
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "train.log"
        block = _explain_block()
        with open(log, "wb") as out:
            written = 0
            while written < size:
                out.write(block)
                written += len(block)
            out.write(b"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.15 GiB of which 1.06 GiB is free. Including non-PyTorch memory, this process has 78.08 GiB memory in use. Of the allocated memory 68.52 GiB is allocated by PyTorch, and 8.93 GiB is reserved by PyTorch but unallocated.\n")
        gib = log.stat().st_size / 2**30
        wc_wall, wc_cpu, _ = _timed(["wc", "-l", str(log)], runs)
        wall, cpu, output = _timed([str(binary), "explain", str(log)], runs)
        if "rule torch-oom/fragmentation" not in output:
            sys.exit(f"bench: explain did not find the failure at the end of the log:\n{output[:2000]}")
    lines = ["## Explain", "",
             f"Target: a 1 GiB log explained in under 5 s. Log: {gib:.2f} GiB of mixed training-log lines "
             "(progress, XLA/NCCL info, warnings, JSON metrics) with a PyTorch OOM at the very end; "
             f"median of {runs} run(s), page cache warm.", "",
             "| command | wall | CPU | throughput (wall) |", "|---|---|---|---|",
             f"| `gpuvisor explain train.log` | {wall:.2f} s | {cpu:.2f} s | {gib / wall:.2f} GiB/s |",
             f"| `wc -l train.log` (reading floor) | {wc_wall:.2f} s | {wc_cpu:.2f} s | {gib / wc_wall:.2f} GiB/s |",
             "", "Measured by `python3 scripts/bench.py --only explain`."]
    return lines


SECTIONS = {"planner": section_planner, "explain": section_explain}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer iterations (for a smoke run)")
    parser.add_argument("--only", nargs="*", choices=sorted(SECTIONS), help="run only these sections")
    args = parser.parse_args()
    chosen = args.only or list(SECTIONS)
    body = []
    for name in chosen:
        print(f"bench: {name} ...", file=sys.stderr)
        body += SECTIONS[name](args) + [""]
    header = [
        "# Benchmarks", "",
        f"Generated by `python3 scripts/bench.py` on {datetime.date.today()} — {machine()}.",
        "Comparisons are measured side by side in the same run; read the ratios, not the absolute times.", "",
    ]
    DOC.write_text("\n".join(header + body).rstrip() + "\n")
    print(f"bench: wrote {DOC.relative_to(ROOT)}", file=sys.stderr)


if __name__ == "__main__":
    main()
